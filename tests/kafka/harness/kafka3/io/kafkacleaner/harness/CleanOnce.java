package io.kafkacleaner.harness;

import kafka.common.LogCleaningAbortedException;
import kafka.log.Cleaner;
import kafka.log.CleanerStats;
import kafka.log.LogCleanerManager;
import kafka.log.LogToClean;
import kafka.log.PreCleanStats;
import kafka.log.UnifiedLog;
import kafka.server.BrokerTopicStats;
import kafka.utils.Pool;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.KafkaStorageException;
import org.apache.kafka.server.util.KafkaScheduler;
import org.apache.kafka.storage.internals.log.CleanerConfig;
import org.apache.kafka.storage.internals.log.LogConfig;
import org.apache.kafka.storage.internals.log.LogDirFailureChannel;
import org.apache.kafka.storage.internals.log.LogOffsetsListener;
import org.apache.kafka.storage.internals.log.ProducerStateManagerConfig;
import org.apache.kafka.storage.internals.log.SkimpyOffsetMap;
import org.apache.kafka.storage.internals.utils.Throttler;

import java.io.File;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;

import scala.Option;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * Kafka 3.9's own cleaner (the Scala kafka.log classes, called from Java), run on a copy
 * of a broker's log dir until nothing is eligible, exactly as the Kafka 4 harness does:
 * UnifiedLog.apply with the broker's checkpoints, LogCleanerManager to choose and to write
 * cleaner-offset-checkpoint, Cleaner.doClean one round at a time, every clock fixed at
 * --now-ms. Prints the same JSON object.
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
        BrokerTopicStats topicStats = new BrokerTopicStats(false);
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

    /** Loads the log dir's partitions, cleans until nothing is eligible, closes them; returns
     * the nanoseconds spent in Cleaner.doClean. */
    private static long clean(Harness h, File logDir, Harness.FixedTime time,
                              KafkaScheduler scheduler, LogDirFailureChannel failures, BrokerTopicStats topicStats,
                              Harness.Json out) throws Exception {
        long loadStarted = System.nanoTime();
        Pool<TopicPartition, UnifiedLog> logs = new Pool<>(Option.empty());
        List<UnifiedLog> loaded = new ArrayList<>();
        List<File> dirs = h.partitionDirs(logDir);
        for (File dir : dirs) {
            Long logStart = Harness.checkpointed("log-start-offset-checkpoint", dir);
            Long recoveryPoint = Harness.checkpointed("recovery-point-offset-checkpoint", dir);
            UnifiedLog log = UnifiedLog.apply(dir, new LogConfig(h.configOf(dir)), logStart == null ? 0L : logStart,
                    recoveryPoint == null ? 0L : recoveryPoint, scheduler, topicStats, time, 60_000,
                    new ProducerStateManagerConfig(h.producerIdExpirationMs, false), 600_000, failures,
                    Harness.hadCleanShutdown(logDir), Option.empty(), true, new ConcurrentHashMap<>(), false,
                    LogOffsetsListener.NO_OP_OFFSETS_LISTENER);
            Long highWatermark = Harness.checkpointed("replication-offset-checkpoint", dir);
            if (highWatermark != null) log.updateHighWatermark(highWatermark);
            logs.put(log.topicPartition(), log);
            loaded.add(log);
        }
        long loadNs = System.nanoTime() - loadStarted;

        LogCleanerManager manager = new LogCleanerManager(
                CollectionConverters.asScala(List.of(logDir)).toSeq(), logs, failures);
        int bytesPerEntry = new SkimpyOffsetMap(1024, CleanerConfig.HASH_ALGORITHM).bytesPerEntry;
        SkimpyOffsetMap offsetMap = new SkimpyOffsetMap(h.offsetMapMemory(bytesPerEntry), CleanerConfig.HASH_ALGORITHM);
        Throttler throttler = new Throttler(Double.MAX_VALUE, 300, "cleaner-io", "bytes", time);
        Cleaner cleaner = new Cleaner(0, offsetMap, h.ioBufferSize / h.threads / 2, h.maxMessageBytes,
                h.loadFactor, throttler, time, tp -> BoxedUnit.UNIT);

        out.put("kafka", "3").put("hashAlgorithm", CleanerConfig.HASH_ALGORITHM)
                .put("mapSlots", offsetMap.slots()).put("mapMaxKeys", (int) (offsetMap.slots() * h.loadFactor));
        out.array("rounds");
        long cleanNs = 0;
        List<String[]> uncleanable = new ArrayList<>();
        // LogCleaner.CleanerThread.doWork, tryCleanFilthiestLog, cleanFilthiestLog and cleanLog,
        // as Kafka writes them, with no backoff: until a pass finds nothing to clean.
        while (true) {
            Option<LogToClean> next = manager.grabFilthiestCompactedLog(time, new PreCleanStats());
            UnifiedLog failed = null;
            Exception failure = null;
            if (next.isDefined()) {
                LogToClean ltc = next.get();
                long endOffset = ltc.firstDirtyOffset();
                try {
                    long started = System.nanoTime();
                    Tuple2<Object, CleanerStats> result = cleaner.doClean(ltc, h.nowMs);
                    long elapsed = System.nanoTime() - started;
                    cleanNs += elapsed;
                    endOffset = (Long) result._1();
                    CleanerStats s = result._2();
                    out.open().put("topicPartition", ltc.topicPartition().toString())
                            .put("firstDirtyOffset", ltc.firstDirtyOffset())
                            .put("firstUncleanableOffset", ltc.firstUncleanableOffset())
                            .put("endOffset", endOffset)
                            .put("messagesRead", s.messagesRead()).put("bytesRead", s.bytesRead())
                            .put("messagesWritten", s.messagesWritten()).put("bytesWritten", s.bytesWritten())
                            .put("mapMessagesRead", s.mapMessagesRead()).put("invalidMessagesRead", s.invalidMessagesRead())
                            .put("elapsedSecs", s.elapsedSecs()).put("elapsedIndexSecs", s.elapsedIndexSecs())
                            .put("bufferUtilization", s.bufferUtilization()).put("cleanNanos", elapsed).close();
                } catch (Exception e) {
                    if (e instanceof LogCleaningAbortedException || e instanceof KafkaStorageException
                            || e instanceof IOException) {
                        // cleanLog lets these go (an IOException takes the log dir offline instead).
                        uncleanable.add(new String[] {ltc.topicPartition().toString(), "let go: " + e});
                    } else {
                        failed = ltc.log();
                        failure = e;
                    }
                } finally {
                    manager.doneCleaning(ltc.topicPartition(), ltc.log().parentDirFile(), endOffset);
                }
            }
            if (failed == null) {
                List<Tuple2<TopicPartition, UnifiedLog>> deletable =
                        new ArrayList<>(CollectionConverters.asJavaCollection(manager.deletableLogs()));
                try {
                    for (Tuple2<TopicPartition, UnifiedLog> entry : deletable) {
                        try {
                            entry._2().deleteOldSegments();
                        } catch (Exception e) {
                            failed = entry._2();
                            failure = e;
                            break;
                        }
                    }
                } finally {
                    List<TopicPartition> keys = new ArrayList<>();
                    for (Tuple2<TopicPartition, UnifiedLog> entry : deletable) keys.add(entry._1());
                    manager.doneDeleting(CollectionConverters.asScala(keys));
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
        for (UnifiedLog log : loaded) log.close();
        out.put("loadNanos", loadNs).put("closeNanos", System.nanoTime() - closeStarted);
        return cleanNs;
    }
}
