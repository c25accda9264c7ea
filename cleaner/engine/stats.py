"""What one clean did (Kafka's ``CleanerStats``) and the log line Kafka writes after it
(KAFKA_NOTES §12.2), so that operators' log searches keep working."""

from __future__ import annotations

from dataclasses import dataclass, field

from cleaner.clock import Time

_MB = 1024.0 * 1024.0


@dataclass
class PreCleanStats:
    """What the manager saw when it chose a log (for the compaction-delay metric)."""

    max_compaction_delay_ms: int = 0
    delayed_partitions: int = 0
    cleanable_partitions: int = 0

    def update_max_compaction_delay(self, delay_ms: int) -> None:
        self.max_compaction_delay_ms = max(self.max_compaction_delay_ms, delay_ms)
        if delay_ms > 0:
            self.delayed_partitions += 1


@dataclass
class CleanerStats:
    time: Time
    start_ns: int = 0
    map_complete_ns: int = -1
    end_ns: int = -1
    bytes_read: int = 0
    bytes_written: int = 0
    map_bytes_read: int = 0
    map_messages_read: int = 0
    messages_read: int = 0
    messages_written: int = 0
    invalid_messages_read: int = 0
    tombstones_removed: int = 0
    buffer_utilization: float = 0.0
    segments_written: int = 0
    groups: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start_ns = self.time.nanoseconds()

    def index_done(self) -> None:
        self.map_complete_ns = self.time.nanoseconds()

    def all_done(self) -> None:
        self.end_ns = self.time.nanoseconds()

    @property
    def elapsed_secs(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e9

    @property
    def elapsed_index_secs(self) -> float:
        return max(self.map_complete_ns - self.start_ns, 0) / 1e9

    @property
    def records_removed(self) -> int:
        return self.messages_read - self.messages_written

    def as_dict(self) -> dict[str, float | int]:
        return {
            "bytesRead": self.bytes_read,
            "bytesWritten": self.bytes_written,
            "mapBytesRead": self.map_bytes_read,
            "mapRecordsRead": self.map_messages_read,
            "recordsRead": self.messages_read,
            "recordsWritten": self.messages_written,
            "invalidRecords": self.invalid_messages_read,
            "tombstonesRemoved": self.tombstones_removed,
            "bufferUtilization": round(self.buffer_utilization, 6),
            "elapsedSeconds": round(self.elapsed_secs, 6),
            "indexSeconds": round(self.elapsed_index_secs, 6),
        }


def _mb(n: float) -> str:
    return f"{n / _MB:,.1f}"


def _rate(n: float, secs: float) -> str:
    return f"{(n / _MB) / secs if secs > 0 else 0.0:,.1f}"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole if whole else 0.0:.1f}"


def stats_message(thread_id: int, log_name: str, first_dirty: int, end_offset: int, stats: CleanerStats) -> str:
    """Kafka's multi-line INFO message after a successful clean (each line after the first
    starts with a tab; "Cleaned ... MB" reports bytes *read*, as Kafka's does)."""
    elapsed = stats.elapsed_secs
    index = stats.elapsed_index_secs
    clean = max(elapsed - index, 0.0)
    return (
        f"Log cleaner thread {thread_id} cleaned log {log_name} (dirty section = [{first_dirty}, {end_offset}])\n"
        f"\t{_mb(stats.bytes_read)} MB of log processed in {elapsed:,.1f} seconds "
        f"({_rate(stats.bytes_read, elapsed)} MB/sec).\n"
        f"\tIndexed {_mb(stats.map_bytes_read)} MB in {index:.1f} seconds "
        f"({_rate(stats.map_bytes_read, index)} Mb/sec, {_pct(index, elapsed)}% of total time)\n"
        f"\tBuffer utilization: {100.0 * stats.buffer_utilization:.1f}%\n"
        f"\tCleaned {_mb(stats.bytes_read)} MB in {clean:.1f} seconds "
        f"({_rate(stats.bytes_read, clean)} Mb/sec, {_pct(clean, elapsed)}% of total time)\n"
        f"\tStart size: {_mb(stats.bytes_read)} MB ({stats.messages_read:,d} messages)\n"
        f"\tEnd size: {_mb(stats.bytes_written)} MB ({stats.messages_written:,d} messages)\n"
        f"\t{100.0 * (1.0 - stats.bytes_written / stats.bytes_read) if stats.bytes_read else 0.0:.1f}% size reduction "
        f"({100.0 * (1.0 - stats.messages_written / stats.messages_read) if stats.messages_read else 0.0:.1f}% "
        f"fewer messages)\n"
    )
