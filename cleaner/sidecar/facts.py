"""The scans' segment facts, with what a read-only scan learns about corruption.

``cleaning.status`` turns a segment that cannot be read into "no facts" (a warning in the
log), and ``scan_segment`` stops quietly at bytes that do not parse, because at the end of
the *active* segment those are a batch the broker is still writing. The sidecar must report
both as what they are in a closed segment: a corrupt partition (``errors`` and an
uncleanable entry in ``/status``), as Kafka's cleaner would mark it when it failed to read
it. A failure is remembered with the file's stamp (device, inode, ctime, size:
``segment_facts.FileStamp``), so a corrupt closed segment is not read again on every scan
either, and a segment the broker changed or replaced since (even under a reused inode
number) is looked at afresh. A file that changed or vanished under the read
(``FileChangedError``) is no verdict at all: the caller looks again. Whether another
failure is corruption or a race with the broker is for the caller to decide (``Sidecar``
wants it seen twice in a row).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from cleaner.errors import FileChangedError, KafkaCleanerError, ThreadShutdownError
from cleaner.segment_facts import FactsCache, FileStamp, SegmentFacts
from cleaner.storage.segment import LogSegment


class ScanFactsCache(FactsCache):
    def __init__(self) -> None:
        super().__init__()
        self.failures: dict[Path, str] = {}
        """Partition dir -> why its segments could not be read, for the current scan."""
        self.errors: dict[Path, BaseException] = {}
        """Partition dir -> the error behind ``failures`` (what the scan-failure metric counts)."""
        self._bad: dict[str, tuple[FileStamp, bool, BaseException]] = {}
        """Path -> the file (its stamp) a look failed on, whether it was the active segment
        then, and the failure."""

    def start_scan(self) -> None:
        self.failures = {}
        self.errors = {}

    def _facts(
        self,
        segment: LogSegment,
        path: str,
        fd: int,
        stamp: FileStamp,
        active: bool,
        throttle: Callable[[int], None] | None,
    ) -> SegmentFacts:
        # The verdict on a file holds for that file only: the same stamp (device, inode,
        # ctime, size: a new file of the same name, even with a reused inode, has another
        # ctime), and the same role (a segment that was active then was read leniently).
        known = self._bad.get(path)
        if known is not None and known[0] == stamp and known[1] == active:
            self._fail(segment, known[2])
            raise known[2]
        self._bad.pop(path, None)
        try:
            facts = super()._facts(segment, path, fd, stamp, active, throttle)
        except (ThreadShutdownError, FileChangedError, FileNotFoundError):
            raise  # the broker changed the file under the read: not a verdict on it
        except (KafkaCleanerError, OSError) as e:
            self._bad[path] = (stamp, active, e)
            self._fail(segment, e)
            raise
        if not active and facts.bytes_scanned < stamp.size:
            # A closed segment ends at a batch boundary: bytes that do not parse are
            # corrupt. The scan read this very file (the fd stat-ed) to its size, so the
            # bytes are not a newer, longer file under the name of an older one.
            error = KafkaCleanerError(
                f"{path}, byte {facts.bytes_scanned}: {stamp.size - facts.bytes_scanned} bytes at the end of "
                "a closed segment do not parse as a record batch (corrupt or truncated)"
            )
            self._bad[path] = (stamp, active, error)
            self._fail(segment, error)
            raise error
        return facts

    def _fail(self, segment: LogSegment, error: BaseException) -> None:
        self.failures.setdefault(segment.log_path.parent, f"{type(error).__name__}: {error}")
        self.errors.setdefault(segment.log_path.parent, error)

    def forget_missing(self) -> None:
        super().forget_missing()
        for path in [p for p in self._bad if not os.path.exists(p)]:
            del self._bad[path]
