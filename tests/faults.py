"""Fault injection for crash-safety tests: every durable step of the storage layer goes
through ``cleaner.storage.files``, so counting and failing calls there reaches them all."""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable

from cleaner.storage import files

DURABLE_STEPS = ("rename", "fsync_dir", "fsync_file", "write_file", "atomic_write", "remove")


class StepFaults:
    """Counts calls to ``files.<name>`` for ``names``; the ``at``-th call (1-based) runs
    ``action`` instead (default: raise an I/O error). ``at=None`` only counts."""

    def __init__(
        self,
        at: int | None = None,
        action: Callable[[], None] | None = None,
        names: Iterable[str] = ("rename", "fsync_dir"),
    ) -> None:
        self.at = at
        self.action = action or self._eio
        self.names = tuple(names)
        self.calls = 0

    @staticmethod
    def _eio() -> None:
        raise OSError(errno.EIO, "injected I/O error")

    def _wrap(self, real: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            self.calls += 1
            if self.calls == self.at:
                self.action()
            return real(*args, **kwargs)

        return wrapper

    def install(self, monkeypatch) -> StepFaults:
        for name in self.names:
            monkeypatch.setattr(files, name, self._wrap(getattr(files, name)))
        return self
