"""Code run as another user, for the claims that depend on file permissions (a sidecar of
another uid than the broker's, a read-only data volume). Root ignores permissions, so such a
test forks a child that drops to the uid and runs the code in-process: the console script
cannot run as another uid here, the interpreter living under /root (mode 0700)."""

from __future__ import annotations

import json
import os
import select
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any


def as_user(uid: int, gid: int, groups: list[int], work: Callable[[], Any]) -> Any:
    """``work()`` in a forked child running as ``uid``/``gid`` with ``groups`` (root only);
    returns its JSON-able result, or fails with the child's exception."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            out = json.dumps(work()).encode()
        except BaseException as e:
            out, code = json.dumps({"error": repr(e)}).encode(), 1
        os.write(w, out)
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    result = json.loads(data)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def killed_while_holding(log_dir: Path, uid: int, gid: int, groups: list[int], *, timeout_s: float = 60.0) -> None:
    """A forked child running as ``uid``/``gid`` with ``groups`` takes ``log_dir``'s lock as a
    commit does (``LogDirLock``), and is SIGKILLed while it holds it."""
    from cleaner.storage.lock import LogDirLock

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            held = LogDirLock(log_dir).acquire()  # noqa: F841 - held until killed
            os.write(w, b"locked")
            while True:
                signal.pause()
        except BaseException as e:
            os.write(w, repr(e).encode())
        os._exit(1)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], timeout_s)
        assert ready, f"the child (uid {uid}) did not report taking the lock of {log_dir} within {timeout_s} s"
        said = os.read(r, 4096)
        assert said == b"locked", said
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
