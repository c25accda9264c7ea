"""Code run as another user, for the claims that depend on file permissions (a sidecar of
another uid than the broker's, a read-only data volume). Root ignores permissions, so such a
test forks a child that drops to the uid and runs the code in-process: the console script
cannot run as another uid here, the interpreter living under /root (mode 0700)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
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
