package io.kafkacleaner.harness;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.KafkaStorageException;
import org.apache.kafka.server.util.KafkaScheduler;
import org.apache.kafka.storage.internals.log.Cleaner;
import org.apache.kafka.storage.internals.log.CleanerConfig;
import org.apache.kafka.storage.internals.log.CleanerStats;
import org.apache.kafka.storage.internals.log.LogCleanerManager;
import org.apache.kafka.storage.internals.log.LogConfig;
import org.apache.kafka.storage.internals.log.LogCleaningAbortedException;
import org.apache.kafka.storage.internals.log.LogDirFailureChannel;
import org.apache.kafka.storage.internals.log.LogToClean;
import org.apache.kafka.storage.internals.log.PreCleanStats;
import org.apache.kafka.storage.internals.log.ProducerStateManagerConfig;
import org.apache.kafka.storage.internals.log.SkimpyOffsetMap;
import org.apache.kafka.storage.internals.log.UnifiedLog;
import org.apache.kafka.storage.internals.utils.Throttler;
import org.apache.kafka.storage.log.metrics.BrokerTopicStats;

import java.io.File;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Kafka 4.x's own cleaner, run on a copy of a broker's log dir until nothing is eligible:
 * the log dir's partitions are loaded as the broker loads them (UnifiedLog.create with the
 * broker's checkpoints), Kafka's LogCleanerManager picks the filthiest log and writes
 * cleaner-offset-checkpoint, Kafka's Cleaner (SkimpyOffsetMap, the broker's buffer sizes)
 * cleans one round at a time. Every clock is fixed at --now-ms. Prints one JSON object:
 * Kafka's CleanerStats per round and the time of each Cleaner.doClean call (JVM start and
 * log loading reported separately).
 */
public final class CleanOnce {
    public static void main(String[] args) throws Exception {
        long mainStartedNs = System.nanoTime();
        long jvmStartMs = ManagementFactory.getRuntimeMXBean().getUptime();
        Harness h = new Harness(args);
        Harness.FixedTime time = new Harness.FixedTime(h.nowMs);
        KafkaScheduler scheduler = new KafkaScheduler(1, true, "harness-scheduler-");
        scheduler.startup();
        LogDirFailureChannel failures = new LogDirFailureChannel(1);
        BrokerTopicStats topicStats = new BrokerTopicStats();
        if (h.warmUpDir != null) clean(h, h.warmUpDir, time, scheduler, failures, topicStats, new Harness.Json());
        // One JSON line per log dir (--log-dir-list), each dir cleaned alone.
        for (java.io.File logDir : h.logDirs) {
            Harness.Json out = new Harness.Json().open();
            long cleanNs = clean(h, logDir, time, scheduler, failures, topicStats, out);
            out.put("logDir", logDir.getPath()).put("jvmStartMs", jvmStartMs)
                    .put("mainNanos", System.nanoTime() - mainStartedNs).put("cleanNanos", cleanNs).close();
            System.out.println(out);
        }
        scheduler.shutdown();
        System.exit(0);
    }

    /** A partition's LogConfig from the harness's topic configs. */
    private static LogConfig configOf(Harness h, File dir) {
        Properties props = h.configOf(dir);
        // Kafka 4 refuses segment.bytes below 1 MiB for topics; its tests use this internal override.
        String segmentBytes = props.getProperty("segment.bytes");
        if (segmentBytes != null && Integer.parseInt(segmentBytes) < 1024 * 1024) {
            props.remove("segment.bytes");
            props.put(LogConfig.INTERNAL_SEGMENT_BYTES_CONFIG, segmentBytes);
        }
        return new LogConfig(props);
    }

    /** Loads the log dir's partitions, cleans until nothing is eligible, closes them; returns
     * the nanoseconds spent in Cleaner.doClean. */
    private static long clean(Harness h, File logDir, Harness.FixedTime time,
                              KafkaScheduler scheduler, LogDirFailureChannel failures, BrokerTopicStats topicStats,
                              Harness.Json out) throws Exception {
        long loadStarted = System.nanoTime();
        ConcurrentHashMap<TopicPartition, UnifiedLog> logs = new ConcurrentHashMap<>();
        List<File> dirs = h.partitionDirs(logDir);
        for (File dir : dirs) {
            Long logStart = Harness.checkpointed("log-start-offset-checkpoint", dir);
            Long recoveryPoint = Harness.checkpointed("recovery-point-offset-checkpoint", dir);
            UnifiedLog log = UnifiedLog.create(dir, configOf(h, dir), logStart == null ? 0L : logStart,
                    recoveryPoint == null ? 0L : recoveryPoint, scheduler, topicStats, time, 60_000,
                    new ProducerStateManagerConfig(h.producerIdExpirationMs, false), 600_000, failures,
                    Harness.hadCleanShutdown(logDir), Optional.empty());
            Long highWatermark = Harness.checkpointed("replication-offset-checkpoint", dir);
            if (highWatermark != null) log.updateHighWatermark(highWatermark);
            logs.put(log.topicPartition(), log);
        }
        long loadNs = System.nanoTime() - loadStarted;

        LogCleanerManager manager = new LogCleanerManager(List.of(logDir), logs, failures);
        int bytesPerEntry = new SkimpyOffsetMap(1024, CleanerConfig.HASH_ALGORITHM).bytesPerEntry;
        SkimpyOffsetMap offsetMap = new SkimpyOffsetMap(h.offsetMapMemory(bytesPerEntry), CleanerConfig.HASH_ALGORITHM);
        Throttler throttler = new Throttler(Double.MAX_VALUE, 300, "cleaner-io", "bytes", time);
        Cleaner cleaner = new Cleaner(0, offsetMap, h.ioBufferSize / h.threads / 2, h.maxMessageBytes,
                h.loadFactor, throttler, time, tp -> { });

        out.put("kafka", "4").put("hashAlgorithm", CleanerConfig.HASH_ALGORITHM)
                .put("mapSlots", offsetMap.slots()).put("mapMaxKeys", (int) (offsetMap.slots() * h.loadFactor));
        out.array("rounds");
        long cleanNs = 0;
        List<String[]> uncleanable = new ArrayList<>();
        // LogCleaner.CleanerThread.doWork, tryCleanFilthiestLog, cleanFilthiestLog and cleanLog,
        // as Kafka writes them, with no backoff: until a pass finds nothing to clean.
        while (true) {
            Optional<LogToClean> next = manager.grabFilthiestCompactedLog(time, new PreCleanStats());
            UnifiedLog failed = null;
            Exception failure = null;
            if (next.isPresent()) {
                LogToClean ltc = next.get();
                long endOffset = ltc.firstDirtyOffset();
                try {
                    long started = System.nanoTime();
                    Map.Entry<Long, CleanerStats> result = cleaner.doClean(ltc, h.nowMs);
                    long elapsed = System.nanoTime() - started;
                    cleanNs += elapsed;
                    endOffset = result.getKey();
                    CleanerStats s = result.getValue();
                    out.open().put("topicPartition", ltc.topicPartition().toString())
                            .put("firstDirtyOffset", ltc.firstDirtyOffset())
                            .put("firstUncleanableOffset", ltc.firstUncleanableOffset())
                            .put("endOffset", endOffset)
                            .put("messagesRead", s.messagesRead()).put("bytesRead", s.bytesRead())
                            .put("messagesWritten", s.messagesWritten()).put("bytesWritten", s.bytesWritten())
                            .put("mapMessagesRead", s.mapMessagesRead()).put("invalidMessagesRead", s.invalidMessagesRead())
                            .put("elapsedSecs", s.elapsedSecs()).put("elapsedIndexSecs", s.elapsedIndexSecs())
                            .put("bufferUtilization", s.bufferUtilization()).put("cleanNanos", elapsed).close();
                } catch (LogCleaningAbortedException | KafkaStorageException | IOException e) {
                    // cleanLog lets these go (an IOException takes the log dir offline instead).
                    uncleanable.add(new String[] {ltc.topicPartition().toString(), "let go: " + e});
                } catch (Exception e) {
                    failed = ltc.log();
                    failure = e;
                } finally {
                    manager.doneCleaning(ltc.topicPartition(), ltc.log().parentDirFile(), endOffset);
                }
            }
            if (failed == null) {
                Map<TopicPartition, UnifiedLog> deletable = manager.deletableLogs();
                try {
                    for (UnifiedLog log : deletable.values()) {
                        try {
                            log.deleteOldSegments();
                        } catch (Exception e) {
                            failed = log;
                            failure = e;
                            break;
                        }
                    }
                } finally {
                    manager.doneDeleting(List.copyOf(deletable.keySet()));
                }
            }
            if (failed != null) {
                // tryCleanFilthiestLog: the partition is marked uncleanable, the thread goes on.
                manager.markPartitionUncleanable(failed.parentDir(), failed.topicPartition());
                uncleanable.add(new String[] {failed.topicPartition().toString(), String.valueOf(failure)});
            }
            manager.maintainUncleanablePartitions();
            if (next.isEmpty()) break;
        }
        out.end();
        out.array("uncleanable");
        for (String[] u : uncleanable) out.open().put("topicPartition", u[0]).put("error", u[1]).close();
        out.end();
        h.awaitDeletedFiles(dirs);
        long closeStarted = System.nanoTime();
        for (UnifiedLog log : logs.values()) log.close();
        out.put("loadNanos", loadNs).put("closeNanos", System.nanoTime() - closeStarted);
        return cleanNs;
    }
}
