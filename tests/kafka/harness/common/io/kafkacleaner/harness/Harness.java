package io.kafkacleaner.harness;

import org.apache.kafka.common.utils.Time;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.function.Supplier;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * What both Kafka lines' harnesses share: the command line, a fixed clock, reading the
 * broker's checkpoint files, choosing the partition directories, JSON output. Nothing here
 * decides what is cleaned: that is Kafka's own LogCleanerManager and Cleaner (CleanOnce).
 *
 * <pre>
 * CleanOnce --log-dir DIR --now-ms MS [--topics REGEX] [--config name=value]...
 *           [--topic-config TOPIC:name=value]...
 *           [--dedupe-buffer-size B | --map-keys N] [--load-factor F] [--io-buffer-size B]
 *           [--threads N] [--max-message-bytes B] [--producer-id-expiration-ms MS]
 *           [--warm-up-dir DIR] [--log-dir-list FILE]
 * </pre>
 * --topic-config: a config of one topic only, over the --config ones (so that one JVM cleans
 * partitions of several shapes, each with its own topic config).
 * --warm-up-dir: first clean that log dir (a copy of the same data) in the same JVM, unreported,
 * so that the reported clean runs JIT-compiled, as in a broker that has been up for a while.
 * --log-dir-list: a file naming log dirs, one a line, cleaned one after the other in this JVM
 * (each alone: its own LogCleanerManager, its own loop), each reported on its own JSON line,
 * in the file's order, instead of --log-dir (the randomized differential: many log dirs, one
 * JVM start).
 */
public final class Harness {
    public final File logDir;
    /** --log-dir-list: the log dirs to clean, each alone, in order (else just logDir). */
    public final List<File> logDirs = new ArrayList<>();
    public final File warmUpDir;
    public final long nowMs;
    public final Pattern topics;
    public final Properties topicConfig = new Properties();
    /** Per topic: the configs that override topicConfig for that topic's partitions. */
    public final Map<String, Properties> perTopicConfig = new HashMap<>();
    public final long dedupeBufferSize;
    /** When set, the SkimpyOffsetMap is sized so that Kafka's maxDesiredMapSize is exactly this. */
    public final int mapKeys;
    public final double loadFactor;
    public final int ioBufferSize;
    public final int threads;
    public final int maxMessageBytes;
    public final int producerIdExpirationMs;

    public Harness(String[] args) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i < args.length; i += 2) {
            if (i + 1 >= args.length || !args[i].startsWith("--"))
                throw new IllegalArgumentException("expected --option value pairs, got " + String.join(" ", args));
            if (args[i].equals("--config")) {
                String[] kv = args[i + 1].split("=", 2);
                topicConfig.put(kv[0], kv[1]);
            } else if (args[i].equals("--topic-config")) {
                int colon = args[i + 1].indexOf(':');
                String[] kv = args[i + 1].substring(colon + 1).split("=", 2);
                perTopicConfig.computeIfAbsent(args[i + 1].substring(0, colon), t -> new Properties()).put(kv[0], kv[1]);
            } else {
                opts.put(args[i].substring(2), args[i + 1]);
            }
        }
        if (opts.containsKey("log-dir-list")) {
            try {
                for (String line : Files.readAllLines(new File(opts.get("log-dir-list")).toPath()))
                    if (!line.isBlank()) logDirs.add(new File(line.strip()));
            } catch (IOException e) {
                throw new IllegalArgumentException("cannot read --log-dir-list", e);
            }
            logDir = logDirs.isEmpty() ? null : logDirs.get(0);
        } else {
            logDir = new File(required(opts, "log-dir"));
            logDirs.add(logDir);
        }
        warmUpDir = opts.containsKey("warm-up-dir") ? new File(opts.get("warm-up-dir")) : null;
        nowMs = Long.parseLong(required(opts, "now-ms"));
        topics = Pattern.compile(opts.getOrDefault("topics", ".*"));
        dedupeBufferSize = Long.parseLong(opts.getOrDefault("dedupe-buffer-size", "134217728"));
        mapKeys = Integer.parseInt(opts.getOrDefault("map-keys", "0"));
        loadFactor = Double.parseDouble(opts.getOrDefault("load-factor", "0.9"));
        ioBufferSize = Integer.parseInt(opts.getOrDefault("io-buffer-size", "524288"));
        threads = Integer.parseInt(opts.getOrDefault("threads", "1"));
        maxMessageBytes = Integer.parseInt(opts.getOrDefault("max-message-bytes", "1048588"));
        producerIdExpirationMs = Integer.parseInt(opts.getOrDefault("producer-id-expiration-ms", "86400000"));
        // Old segments are renamed .deleted and removed by the scheduler after this delay.
        topicConfig.putIfAbsent("file.delete.delay.ms", "0");
    }

    private static String required(Map<String, String> opts, String name) {
        String value = opts.get(name);
        if (value == null) throw new IllegalArgumentException("--" + name + " is required");
        return value;
    }

    /**
     * The offset map's memory, as the broker's LogCleaner computes it per thread
     * ({@code min(dedupeBufferSize / threads, Int.MaxValue)}), or, with --map-keys, the
     * smallest memory whose {@code (int)(slots * loadFactor)} is exactly that many keys.
     */
    public int offsetMapMemory(int bytesPerEntry) {
        if (mapKeys <= 0) return (int) Math.min(dedupeBufferSize / threads, Integer.MAX_VALUE);
        long slots = (long) Math.ceil(mapKeys / loadFactor);
        while ((int) (slots * loadFactor) > mapKeys) slots--;
        while ((int) (slots * loadFactor) < mapKeys) slots++;
        return Math.toIntExact(slots * bytesPerEntry);
    }

    /** The topic config of one partition directory: --config, then that topic's --topic-config. */
    public Properties configOf(File partitionDir) {
        Properties props = new Properties();
        props.putAll(topicConfig);
        String name = partitionDir.getName();
        Properties own = perTopicConfig.get(name.substring(0, name.lastIndexOf('-')));
        if (own != null) props.putAll(own);
        return props;
    }

    /**
     * The partition directories of the log dir whose topic matches --topics, in name order:
     * what LogManager.loadLogs loads (not the KRaft metadata log {@code __cluster_metadata-0},
     * not tiered storage's {@code remote-log-index-cache}) and puts into the logs the cleaner
     * sees (not the {@code -delete}, {@code -future} and {@code -stray} directories, whose names
     * do not end in a partition number).
     */
    public List<File> partitionDirs(File logDir) throws IOException {
        List<File> out = new ArrayList<>();
        try (Stream<java.nio.file.Path> entries = Files.list(logDir.toPath())) {
            entries.map(java.nio.file.Path::toFile).filter(File::isDirectory).sorted().forEach(dir -> {
                String name = dir.getName();
                int dash = name.lastIndexOf('-');
                if (dash > 0 && name.substring(dash + 1).matches("\\d+")
                        && !name.substring(0, dash).equals(METADATA_TOPIC) && !name.equals(REMOTE_INDEX_CACHE)
                        && topics.matcher(name.substring(0, dash)).matches())
                    out.add(dir);
            });
        }
        return out;
    }

    /** KafkaRaftServer.MetadataTopic: LogManager.loadLogs never loads it. */
    public static final String METADATA_TOPIC = "__cluster_metadata";
    /** RemoteIndexCache.DIR_NAME: LogManager.loadLogs skips it. */
    public static final String REMOTE_INDEX_CACHE = "remote-log-index-cache";

    /** The partition's offset in one of the log dir's checkpoint files (version 0 format), or null. */
    public static Long checkpointed(String file, File partitionDir) throws IOException {
        File f = new File(partitionDir.getParentFile(), file);
        if (!f.exists()) return null;
        List<String> lines = Files.readAllLines(f.toPath());
        String name = partitionDir.getName();
        int dash = name.lastIndexOf('-');
        String wanted = name.substring(0, dash) + " " + name.substring(dash + 1) + " ";
        for (String line : lines.subList(Math.min(2, lines.size()), lines.size()))
            if (line.startsWith(wanted)) return Long.parseLong(line.substring(wanted.length()).trim());
        return null;
    }

    public static boolean hadCleanShutdown(File logDir) {
        return new File(logDir, ".kafka_cleanshutdown").exists();
    }

    /**
     * Waits for the scheduler to remove the .deleted files of replaced segments (a real
     * condition, polled; file.delete.delay.ms is 0), so that the directory shows what a
     * broker leaves once its delete tasks ran.
     */
    public void awaitDeletedFiles(List<File> dirs) throws InterruptedException {
        long deadline = System.nanoTime() + 30_000_000_000L;
        while (System.nanoTime() < deadline) {
            boolean pending = false;
            for (File dir : dirs) {
                String[] left = dir.list((d, n) -> n.endsWith(".deleted"));
                pending |= left != null && left.length > 0;
            }
            if (!pending) return;
            Thread.sleep(10);
        }
        throw new IllegalStateException(".deleted files still present after 30 s");
    }

    /** A clock that stands still at --now-ms: every decision of the clean sees the same time. */
    public static final class FixedTime implements Time {
        private final long ms;

        public FixedTime(long ms) {
            this.ms = ms;
        }

        @Override
        public long milliseconds() {
            return ms;
        }

        @Override
        public long nanoseconds() {
            return ms * 1_000_000L;
        }

        @Override
        public void sleep(long sleepMs) {
        }

        @Override
        public void waitObject(Object obj, Supplier<Boolean> condition, long deadlineMs) {
            if (!condition.get()) throw new IllegalStateException("a fixed clock cannot wait for a condition");
        }
    }

    /** A minimal JSON writer for the harness's one output object. */
    public static final class Json {
        private final StringBuilder out = new StringBuilder();
        private boolean first = true;

        public Json open() {
            comma();
            out.append('{');
            first = true;
            return this;
        }

        public Json close() {
            out.append('}');
            first = false;
            return this;
        }

        public Json array(String key) {
            key(key);
            out.append('[');
            first = true;
            return this;
        }

        public Json end() {
            out.append(']');
            first = false;
            return this;
        }

        public Json key(String key) {
            comma();
            out.append('"').append(key).append("\":");
            first = true;
            return this;
        }

        public Json put(String key, Object value) {
            key(key);
            if (value instanceof String s) out.append('"').append(s.replace("\\", "\\\\").replace("\"", "\\\"")).append('"');
            else if (value instanceof Double d) out.append(String.format(Locale.ROOT, "%.6f", d));
            else out.append(value);
            first = false;
            return this;
        }

        private void comma() {
            if (!first) out.append(',');
            first = false;
        }

        @Override
        public String toString() {
            return out.toString();
        }
    }
}
