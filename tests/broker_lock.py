"""The broker's ``.lock`` held by another process, as a running broker holds it: POSIX
record locks belong to a process, so a lock taken by the test process itself would not keep
the code under test (in the same process) out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_LOCK_SCRIPT = r"""
import fcntl, os, sys
created = not os.path.lexists(sys.argv[1])
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    print("busy", flush=True)
    sys.exit(3)
print("locked", flush=True)
if sys.argv[2] == "hold":
    sys.stdin.read()
    # Kafka's FileLock.destroy at a clean shutdown: unlock, then delete the file.
    fcntl.lockf(fd, fcntl.LOCK_UN)
    os.unlink(sys.argv[1])
elif created:  # a probe leaves the directory as it found it
    os.unlink(sys.argv[1])
"""


class BrokerLock:
    """A child process holding ``<log_dir>/.lock`` with ``lockf`` (what a broker's
    ``FileChannel.tryLock`` takes), until ``release``, which deletes the file as Kafka's
    shutdown does (``FileLock.destroy``)."""

    def __init__(self, log_dir: Path) -> None:
        self.path = Path(log_dir) / ".lock"
        self.proc: subprocess.Popen[str] | None = None

    def acquire(self) -> BrokerLock:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-c", _LOCK_SCRIPT, str(self.path), "hold"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        answer = self.proc.stdout.readline().strip()
        if answer != "locked":
            self.proc.wait(10)
            raise AssertionError(f"the simulated broker could not lock {self.path}: {answer!r}")
        return self

    def release(self) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(10)
            self.proc = None

    def __enter__(self) -> BrokerLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_is_free_for_another_process(log_dir: Path) -> bool:
    """Whether a broker starting now could take the log dir's ``.lock``."""
    out = subprocess.run(
        [sys.executable, "-P", "-c", _LOCK_SCRIPT, str(Path(log_dir) / ".lock"), "probe"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.strip() == "locked"
