"""``kafka-cleaner`` run as itself, with a Python audit hook (PEP 578) that records every
file-system change the process asks for under the soak's log dirs.

    python audited_sidecar.py sidecar --policy ... --log-dir ...

Environment: ``SOAK_AUDIT_FILE`` (where the events go, one JSON object a line) and
``SOAK_AUDIT_ROOTS`` (``os.pathsep``-separated directories watched). Recorded: ``open`` with
any of O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND; ``os.mkdir``, ``os.rename`` (also
``os.replace``), ``os.remove`` (``os.unlink``), ``os.rmdir``, ``os.link``, ``os.symlink``,
``os.truncate``, ``os.chmod``, ``os.chown``, ``os.utime``, ``shutil.rmtree``; and every
``fcntl.lockf``/``fcntl.flock`` (a lock taken on anything). A path relative to a ``dir_fd``
is resolved through ``/proc/self/fd``; a relative ``open`` (whose ``dir_fd`` the audit event
does not carry) is recorded as ``unresolved`` with its name.

This is the real command (``cleaner.cli.main``): the hook only looks. Python-level calls are
what it sees; the compiled core (``cleaner._native``) only encodes and decodes bytes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {
    # event: (indexes of path arguments, index of their dir_fd or None)
    "os.mkdir": ((0,), 2),
    "os.rename": ((0, 1), 2),
    "os.remove": ((0,), 1),
    "os.rmdir": ((0,), 1),
    "os.link": ((0, 1), 2),
    "os.symlink": ((1,), 2),
    "os.truncate": ((0,), None),
    "os.chmod": ((0,), 2),
    "os.chown": ((0,), 3),
    "os.utime": ((0,), 3),
    "shutil.rmtree": ((0,), 1),
}


def _install() -> None:
    out_path = os.environ.get("SOAK_AUDIT_FILE")
    roots = [os.path.realpath(r) for r in os.environ.get("SOAK_AUDIT_ROOTS", "").split(os.pathsep) if r]
    if not out_path or not roots:
        return
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    busy = threading.local()

    def fd_dir(dir_fd: object) -> str | None:
        if isinstance(dir_fd, int) and dir_fd >= 0:
            try:
                return os.readlink(f"/proc/self/fd/{dir_fd}")
            except OSError:
                return None
        return None

    def resolve(p: object, dir_fd: object) -> tuple[str | None, bool]:
        """(absolute path, resolved?)"""
        if isinstance(p, int):
            return fd_dir(p), True  # an fd (ftruncate, fchmod): where it points
        try:
            s = os.fsdecode(os.fspath(p))  # type: ignore[arg-type]
        except TypeError:
            return None, False
        if os.path.isabs(s):
            return s, True
        base = fd_dir(dir_fd)
        if base is not None:
            return os.path.join(base, s), True
        return s, False

    def inside(p: str) -> bool:
        return any(p == r or p.startswith(r + os.sep) for r in roots)

    def emit(event: str, paths: list[str], resolved: bool, extra: dict | None = None) -> None:
        rec = {
            "t": time.time(),
            "event": event,
            "paths": paths,
            "resolved": resolved,
            "thread": threading.current_thread().name,
        }
        if extra:
            rec.update(extra)
        os.write(fd, (json.dumps(rec) + "\n").encode())

    def hook(event: str, args: tuple) -> None:
        if getattr(busy, "on", False):
            return
        if event == "open":
            if len(args) < 3 or not isinstance(args[2], int) or not args[2] & _WRITE_FLAGS:
                return
            path, ok = resolve(args[0], None)
            if path is None:
                return
            busy.on = True
            try:
                if not ok:
                    emit("open", [path], False, {"flags": args[2]})
                elif inside(path):
                    emit("open", [path], True, {"flags": args[2]})
            finally:
                busy.on = False
            return
        if event in ("fcntl.lockf", "fcntl.flock"):
            busy.on = True
            try:
                where = fd_dir(args[0]) if args and isinstance(args[0], int) else None
                emit(event, [where or "?"], where is not None, {"cmd": args[1] if len(args) > 1 else None})
            finally:
                busy.on = False
            return
        spec = _PATH_EVENTS.get(event)
        if spec is None:
            return
        idx, dir_idx = spec
        dir_fd = args[dir_idx] if dir_idx is not None and dir_idx < len(args) else None
        busy.on = True
        try:
            paths, all_ok = [], True
            for i in idx:
                if i >= len(args):
                    continue
                p, ok = resolve(args[i], dir_fd)
                if p is None:
                    continue
                paths.append(p)
                all_ok = all_ok and ok
            if paths and (not all_ok or any(inside(p) for p in paths)):
                emit(event, paths, all_ok)
        finally:
            busy.on = False

    sys.addaudithook(hook)


if __name__ == "__main__":
    _install()
    from cleaner.cli import main

    sys.argv = ["kafka-cleaner", *sys.argv[1:]]
    main()
