"""Typed errors. Bad input never surfaces as a bare exception: every error that comes
from data on disk names the file, the byte position or offset, and the reason, so an
operator can find the bad bytes with ``kafka-cleaner dump``.

Names follow Kafka's exceptions where one exists (CorruptRecordException,
LogCleaningAbortedException, LogSegmentOffsetOverflowException, ...).
"""

from __future__ import annotations

import errno
import os


class KafkaCleanerError(Exception):
    """Base class of every error this package raises on purpose."""


def failure_reason(error: BaseException) -> str:
    """A failure as one line for a person: our own errors already name the file, position
    and reason; anything else (a bug, an OS error) keeps its type's name."""
    return str(error) if isinstance(error, KafkaCleanerError) else f"{type(error).__name__}: {error}"


class CorruptDataError(KafkaCleanerError):
    """Bytes on disk that do not follow Kafka's format.

    ``path`` is the file (None when decoding an in-memory buffer), ``position`` the byte
    position inside it, ``offset`` the Kafka offset concerned, when known.
    """

    def __init__(
        self,
        reason: str,
        *,
        path: str | os.PathLike[str] | None = None,
        position: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.path = os.fspath(path) if path is not None else None
        self.position = position
        self.offset = offset
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path)
        if self.position is not None:
            where.append(f"byte {self.position}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        return f"{', '.join(where)}: {self.reason}" if where else self.reason

    def located(
        self,
        *,
        path: str | os.PathLike[str] | None = None,
        base_position: int = 0,
    ) -> CorruptDataError:
        """The same error with the file name filled in and the position made absolute.

        Decoders work on buffers and do not know which file or where in it they are;
        the storage layer re-raises their errors through this.
        """
        return type(self)(
            self.reason,
            path=path if self.path is None else self.path,
            position=None if self.position is None else self.position + base_position,
            offset=self.offset,
        )


class CorruptRecordError(CorruptDataError):
    """A record batch or record violates the format (Kafka: CorruptRecordException)."""


def truncated_batch(
    path: str | os.PathLike[str] | None, position: int, needed: int | None, left: int
) -> CorruptRecordError:
    """The one wording of a batch cut short by the end of its file (a truncated copy, a
    disk that filled up), used by ``dump``, ``status`` and the cleaner alike."""
    needs = f" of the {needed} the batch needs" if needed is not None else ""
    return CorruptRecordError(
        f"truncated batch: the file ends {left} byte(s) into it{needs}", path=path, position=position
    )


class InvalidRecordError(CorruptRecordError):
    """Well-framed bytes whose content is invalid (bad CRC, bad attributes, ...)."""


class CorruptIndexError(CorruptDataError):
    """An offset, time or transaction index is inconsistent (Kafka: CorruptIndexException)."""


class CorruptCheckpointError(CorruptDataError):
    """A checkpoint or metadata text file does not parse strictly."""


class CorruptSnapshotError(CorruptDataError):
    """A producer-state snapshot has a bad version or CRC (Kafka: CorruptSnapshotException)."""


class FileChangedError(KafkaCleanerError):
    """A file a running broker writes changed while it was being read: a read came back
    short because the file shrank (an index trimmed at a roll, a truncation), or it vanished
    or was renamed (retention, topic deletion's ``-delete``, a reassignment). Not corruption:
    the next look sees the file as it now is."""

    def __init__(self, path: str | os.PathLike[str], what: str) -> None:
        self.path = os.fspath(path)
        super().__init__(f"{self.path}: the file changed while it was read ({what}); the next scan reads it again")


class FileVanishedError(FileChangedError, FileNotFoundError):
    """A file a running broker owns was not there to be read: renamed away or deleted since
    the directory was listed (retention's ``.deleted``, a cleaner's swap, a topic deletion's
    ``-delete``, a move). Not corruption and not a reason to give up on the partition:
    look again at the directory as it now is. Still a ``FileNotFoundError`` for code that
    catches that."""

    def __init__(self, path: str | os.PathLike[str], what: str = "renamed or deleted since the listing") -> None:
        super().__init__(path, f"vanished: {what}")
        self.errno = errno.ENOENT
        self.filename = self.path

    def __str__(self) -> str:
        return str(self.args[0])  # the message, not OSError's "[Errno 2] ..."


class LogSegmentOffsetOverflowError(KafkaCleanerError):
    """An offset does not fit the segment's 32-bit relative range."""

    def __init__(self, segment_base_offset: int, offset: int) -> None:
        self.segment_base_offset = segment_base_offset
        self.offset = offset
        super().__init__(
            f"offset {offset} does not fit segment with base offset {segment_base_offset} "
            f"(relative offset {offset - segment_base_offset} > {2**31 - 1})"
        )


class LogCleaningAbortedError(KafkaCleanerError):
    """The clean of a partition was aborted (truncation, pause, shutdown); nothing was changed."""


class SwapIncompleteError(KafkaCleanerError):
    """A segment swap failed *after* its commit point: the cleaned segments are in place on
    disk (a broker's start-up, or opening the log again, completes the swap); nothing may
    delete them."""


class ThreadShutdownError(KafkaCleanerError):
    """Raised inside a cleaner thread when the pool is shutting down."""


class LogDirLockedError(KafkaCleanerError):
    """Another process (normally the Kafka broker) holds the log directory's ``.lock``."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = os.fspath(log_dir)
        super().__init__(
            f"{self.log_dir}: the log directory is locked by another process (a running Kafka "
            f"broker?); stop the broker or use `status` / sidecar observe mode, which only read"
        )


class PolicyError(KafkaCleanerError):
    """A policy file or field is invalid. ``field`` is a dotted path such as ``spec.topics[0].match``."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)
