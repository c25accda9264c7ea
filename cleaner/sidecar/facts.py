"""The scans' segment facts, with what a read-only scan learns about corruption.

``cleaning.status`` turns a segment that cannot be read into "no facts" (a warning in the
log), and ``scan_segment`` stops quietly at bytes that do not parse, because at the end of
the *active* segment those are a batch the broker is still writing. The sidecar must report
both as what they are in a closed segment: a corrupt partition (``errors`` and an
uncleanable entry in ``/status``), as Kafka's cleaner would mark it when it failed to read
it. A failure is remembered with the segment's identity (inode, size, mtime), so a corrupt
closed segment is not read again on every scan either, and a segment the broker changed
since is looked at afresh. Whether a failure is corruption or a race with the broker is
for the caller to decide (``Sidecar`` wants it seen twice in a row).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from cleaner.errors import KafkaCleanerError, ThreadShutdownError
from cleaner.segment_facts import FactsCache, SegmentFacts
from cleaner.storage.segment import LogSegment


class ScanFactsCache(FactsCache):
    def __init__(self) -> None:
        super().__init__()
        self.failures: dict[Path, str] = {}
        """Partition dir -> why its segments could not be read, for the current scan."""
        self.errors: dict[Path, BaseException] = {}
        """Partition dir -> the error behind ``failures`` (what the scan-failure metric counts)."""
        self._bad: dict[str, tuple[tuple[int, int, int, int], BaseException]] = {}

    def start_scan(self) -> None:
        self.failures = {}
        self.errors = {}

    def facts(
        self, segment: LogSegment, *, active: bool, throttle: Callable[[int], None] | None = None
    ) -> SegmentFacts:
        path = str(segment.log_path)
        st = os.stat(path)  # a segment deleted since the listing is no corruption: just raise
        identity = (st.st_ino, st.st_dev, st.st_size, 0 if active else st.st_mtime_ns)
        known = self._bad.get(path)
        if known is not None and known[0] == identity:
            self._fail(segment, known[1])
            raise known[1]
        try:
            facts = super().facts(segment, active=active, throttle=throttle)
        except (ThreadShutdownError, FileNotFoundError):
            raise
        except (KafkaCleanerError, OSError) as e:
            self._bad[path] = (identity, e)
            self._fail(segment, e)
            raise
        if not active and facts.bytes_scanned < st.st_size:
            # A closed segment ends at a batch boundary: bytes that do not parse are corrupt.
            error = KafkaCleanerError(
                f"{path}, byte {facts.bytes_scanned}: {st.st_size - facts.bytes_scanned} bytes at the end of "
                "a closed segment do not parse as a record batch (corrupt or truncated)"
            )
            self._bad[path] = (identity, error)
            self._fail(segment, error)
            raise error
        self._bad.pop(path, None)
        return facts

    def _fail(self, segment: LogSegment, error: BaseException) -> None:
        self.failures.setdefault(segment.log_path.parent, f"{type(error).__name__}: {error}")
        self.errors.setdefault(segment.log_path.parent, error)

    def forget_missing(self) -> None:
        super().forget_missing()
        for path in [p for p in self._bad if not os.path.exists(p)]:
            del self._bad[path]
