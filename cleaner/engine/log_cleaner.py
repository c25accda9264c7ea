"""The cleaner thread pool (Kafka's ``LogCleaner`` and ``CleanerThread``, KAFKA_NOTES §6.7).

Each thread repeats: pick the filthiest eligible log and clean it; run retention on the
compacted logs; back off when there was nothing to clean. A failure in one partition
marks that partition uncleanable and never stops the others; anything else that escapes
kills the thread, which ``restart_dead_threads`` (or a reconfiguration) revives.

Shutdown aborts in-flight cleans at their next check (before every read chunk), which
deletes their ``.cleaned`` files; nothing half-written stays behind.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cleaner.clock import Time
from cleaner.config import CleanerConfig
from cleaner.errors import LogCleaningAbortedError, ThreadShutdownError, failure_reason
from cleaner.storage.topic_partition import TopicPartition

from .cleaner import Cleaner, LogToClean
from .manager import LogCleanerManager, LogCleaningException, ManagedLog
from .offset_map import OffsetMap
from .retention import delete_old_segments
from .stats import CleanerStats, PreCleanStats, stats_message
from .throttler import Throttler

log = logging.getLogger("cleaner.engine.log_cleaner")

ThreadName = "kafka-log-cleaner-thread-{}"


@dataclass
class CleanResult:
    """One finished clean, for ``--json`` output, metrics and the demo."""

    topic_partition: TopicPartition
    log_dir: str
    first_dirty_offset: int
    end_offset: int
    stats: CleanerStats
    thread_id: int


class CleanerThread(threading.Thread):
    def __init__(self, pool: LogCleaner, thread_id: int) -> None:
        super().__init__(name=ThreadName.format(thread_id), daemon=True)
        self.pool = pool
        self.thread_id = thread_id
        config = pool.config
        self.cleaner = Cleaner(
            thread_id,
            OffsetMap(config.dedupe_buffer_per_thread, config.dedupe_buffer_load_factor),
            config.io_buffer_per_thread // 2,
            pool.max_message_bytes,
            pool.throttler,
            pool.time,
            self.check_done,
        )
        self.last_stats: CleanerStats | None = None
        self.last_pre_clean_stats = PreCleanStats()
        self.dead = False
        self.idle = False
        self.chose_a_log = False
        self._shutdown = threading.Event()

    def check_done(self, tp: TopicPartition) -> None:
        if self._shutdown.is_set():
            raise ThreadShutdownError(f"{self.name} is shutting down")
        self.pool.manager.check_cleaning_aborted(tp)

    def initiate_shutdown(self) -> None:
        self._shutdown.set()

    def run(self) -> None:
        try:
            while not self._shutdown.is_set():
                cleaned = self.do_work()
                # A clean that failed (the partition is now uncleanable) does not mean that
                # nothing is left: only a round that found nothing eligible does.
                if self.pool.exit_when_idle and not self.chose_a_log and self.pool.manager_idle():
                    self.idle = True
                    return
                if self.pool.exit_when_idle and self.chose_a_log:
                    continue
                if not cleaned:
                    if self.pool.exit_when_idle:
                        # Another thread is still cleaning: poll for its end (a real wait,
                        # whatever the clock) instead of backing off.
                        self._shutdown.wait(0.05)
                    else:
                        self.pool.time.wait(self._shutdown, self.pool.config.backoff_ms)
        except ThreadShutdownError:
            pass
        except BaseException:
            log.exception("%s: Error due to", self.name)
            self.dead = True
            with self.pool._results_lock:
                self.pool.dead_thread_total += 1

    def do_work(self) -> bool:
        manager = self.pool.manager
        cleaned = False
        self.chose_a_log = False
        try:
            pre = PreCleanStats()
            ltc = manager.grab_filthiest_compacted_log(self.pool.time.milliseconds(), pre)
            if ltc is not None:
                self.chose_a_log = True
                self.last_pre_clean_stats = pre
                managed = manager.logs().get(ltc.topic_partition)
                try:
                    self.clean_log(ltc, managed)
                    cleaned = True
                except ThreadShutdownError:
                    raise
                except Exception as e:
                    raise LogCleaningException(managed, e) from e
            deletable = manager.deletable_logs()
            try:
                for managed in deletable:
                    try:
                        delete_old_segments(managed, self.pool.time.milliseconds())
                    except Exception as e:
                        raise LogCleaningException(managed, e) from e
            finally:
                manager.done_deleting([m.topic_partition for m in deletable])
        except LogCleaningException as e:
            # Kafka's warning, with the cause on the same line; the traceback only at debug
            # level (a person on call needs the file, position and reason, not our stack).
            log.warning(
                "Unexpected exception thrown when cleaning log %s. Marking its partition (%s) as uncleanable: %s",
                e.managed.log.name,
                e.managed.topic_partition,
                failure_reason(e.cause),
            )
            log.debug("The cause of %s's failure", e.managed.topic_partition, exc_info=e.cause)
            manager.mark_partition_uncleanable(e.managed.log_dir, e.managed.topic_partition, failure_reason(e.cause))
            self.pool.notify_uncleanable(e.managed, e.cause)
            cleaned = False
        manager.maintain_uncleanable_partitions()
        return cleaned

    def clean_log(self, ltc: LogToClean, managed: ManagedLog) -> None:
        manager = self.pool.manager
        end = ltc.first_dirty_offset
        try:
            end, stats = self.cleaner.clean(ltc)
            self.last_stats = stats
            log.info(
                "Cleaner %d: %s",
                self.thread_id,
                stats_message(self.thread_id, ltc.log.name, ltc.first_dirty_offset, end, stats),
            )
            if stats.invalid_messages_read:
                log.warning(
                    "Cleaner %d: Found %d invalid messages during compaction.",
                    self.thread_id,
                    stats.invalid_messages_read,
                )
            self.pool.notify_cleaned(
                CleanResult(
                    ltc.topic_partition, str(managed.log_dir), ltc.first_dirty_offset, end, stats, self.thread_id
                )
            )
        except LogCleaningAbortedError:
            pass
        finally:
            manager.done_cleaning(ltc.topic_partition, managed.log_dir, end)


class LogCleaner:
    def __init__(
        self,
        manager: LogCleanerManager,
        config: CleanerConfig,
        time: Time,
        *,
        max_message_bytes: int = 1048588,
        exit_when_idle: bool = False,
        on_cleaned: Callable[[CleanResult], None] | None = None,
        on_uncleanable: Callable[[ManagedLog, BaseException], None] | None = None,
        io_meter: Callable[[int], None] | None = None,
    ) -> None:
        self.manager = manager
        self.config = config
        self.time = time
        self.max_message_bytes = max_message_bytes
        self.exit_when_idle = exit_when_idle
        """For ``kafka-cleaner clean``: a thread stops once nothing is eligible and no
        other thread is cleaning."""
        self.io_meter = io_meter
        self.throttler = Throttler(config.max_io_bytes_per_second, time, meter=io_meter)
        self.threads: list[CleanerThread] = []
        self.results: list[CleanResult] = []
        self._on_cleaned = on_cleaned
        self._on_uncleanable = on_uncleanable
        self._results_lock = threading.Lock()
        self.dead_thread_total = 0
        """Threads that died since the pool was made: a restart or a reconfiguration revives
        them, and this still counts them (the sidecar's ``cleaner_thread_deaths`` counter)."""

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self.threads = [CleanerThread(self, i) for i in range(self.config.threads)]
        for t in self.threads:
            t.start()

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop every thread: in-flight cleans abort at their next check and delete their
        temporary files before the thread exits."""
        for t in self.threads:
            t.initiate_shutdown()
        for t in self.threads:
            t.join(timeout)

    def join(self) -> None:
        for t in self.threads:
            t.join()

    def reconfigure(self, config: CleanerConfig) -> None:
        """Kafka's dynamic reconfiguration: stop every thread and start new ones (which
        also revives dead threads)."""
        self.shutdown()
        self.config = config
        self.throttler = Throttler(config.max_io_bytes_per_second, self.time, meter=self.io_meter)
        self.start()

    @property
    def dead_thread_count(self) -> int:
        return sum(1 for t in self.threads if t.dead)

    def restart_dead_threads(self) -> int:
        """Replace threads that died of an unexpected error; returns how many."""
        restarted = 0
        for i, t in enumerate(self.threads):
            if t.dead or (not t.is_alive() and not t.idle and not t._shutdown.is_set()):
                replacement = CleanerThread(self, t.thread_id)
                self.threads[i] = replacement
                replacement.start()
                restarted += 1
        return restarted

    def alive(self) -> bool:
        return all(t.is_alive() or t.idle for t in self.threads)

    def manager_idle(self) -> bool:
        """No partition is being cleaned by any thread (paused ones do not count)."""
        return not self.manager.cleaning_in_progress()

    # -- results and hooks ---------------------------------------------------------------
    def notify_cleaned(self, result: CleanResult) -> None:
        with self._results_lock:
            self.results.append(result)
        if self._on_cleaned is not None:
            self._on_cleaned(result)

    def notify_uncleanable(self, managed: ManagedLog, cause: BaseException) -> None:
        if self._on_uncleanable is not None:
            self._on_uncleanable(managed, cause)

    def await_cleaned(self, tp: TopicPartition, offset: int, timeout_ms: int) -> bool:
        """Wait until the checkpoint of ``tp`` reaches ``offset`` (Kafka's test hook)."""
        deadline = self.time.milliseconds() + timeout_ms
        never = threading.Event()
        while True:
            if self.manager.all_cleaner_checkpoints().get(tp, -1) >= offset:
                return True
            remaining = deadline - self.time.milliseconds()
            if remaining <= 0:
                return False
            self.time.wait(never, min(100, remaining))

    # -- Kafka's gauges (over each thread's last clean) -----------------------------------
    def max_buffer_utilization(self) -> float:
        return max((t.last_stats.buffer_utilization for t in self.threads if t.last_stats), default=0.0)

    def recopy_ratio(self) -> float:
        stats = [t.last_stats for t in self.threads if t.last_stats]
        read = sum(s.bytes_read for s in stats)
        return sum(s.bytes_written for s in stats) / max(read, 1)

    def max_clean_time_seconds(self) -> float:
        return max((t.last_stats.elapsed_secs for t in self.threads if t.last_stats), default=0.0)

    def max_compaction_delay_seconds(self) -> float:
        return max((t.last_pre_clean_stats.max_compaction_delay_ms for t in self.threads), default=0) / 1000.0
