"""Fault injection for crash-safety tests: every durable step of the storage layer goes
through ``cleaner.storage.files``, so counting and failing calls there reaches them all."""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable

from cleaner.storage import files
from cleaner.storage.segment import LogSegment

DURABLE_STEPS = ("rename", "fsync_dir", "fsync_file", "write_file", "atomic_write", "remove", "link", "truncate")
ALL_DURABLE_STEPS = (*DURABLE_STEPS, "set_mtime_ms")
"""Every function of ``cleaner.storage.files``, including the mtime stamp of cleaned segments."""
APPEND = (LogSegment, "append", "append")
"""The data written into a ``.cleaned`` segment goes through ``LogSegment.append`` (a plain
file write), not ``files``: a full disk hits exactly there. An ``extra`` step of ``StepFaults``."""


def _describe(arg: object) -> object:
    """What a step touched, as of the call: a file descriptor, or a path (a segment's log
    file under its suffix at that moment)."""
    if isinstance(arg, int):
        return arg
    return str(getattr(arg, "log_path", arg))


class StepFaults:
    """Counts calls to ``files.<name>`` for ``names``; the ``at``-th call (1-based) runs
    ``action`` instead (default: raise an I/O error). ``at=None`` only counts.

    ``extra`` adds other callables as steps, as ``(owner, attribute, label)`` (e.g. the
    data write of a segment, ``(LogSegment, "append", "append")``, which does not go
    through ``files``). Every call is recorded in ``log`` as ``(label, path or file descriptor)``.
    """

    def __init__(
        self,
        at: int | None = None,
        action: Callable[[], None] | None = None,
        names: Iterable[str] = ("rename", "fsync_dir"),
        *,
        extra: Iterable[tuple[object, str, str]] = (),
    ) -> None:
        self.at = at
        self.action = action or self._eio
        self.names = tuple(names)
        self.extra = tuple(extra)
        self.calls = 0
        self.log: list[tuple[str, object]] = []

    @staticmethod
    def _eio() -> None:
        raise OSError(errno.EIO, "injected I/O error")

    def _wrap(self, real: Callable, label: str = "") -> Callable:
        def wrapper(*args, **kwargs):
            self.calls += 1
            self.log.append((label, _describe(args[0]) if args else None))
            if self.calls == self.at:
                self.action()
            return real(*args, **kwargs)

        return wrapper

    def install(self, monkeypatch) -> StepFaults:
        for name in self.names:
            monkeypatch.setattr(files, name, self._wrap(getattr(files, name), name))
        for owner, attribute, label in self.extra:
            monkeypatch.setattr(owner, attribute, self._wrap(getattr(owner, attribute), label))
        return self
