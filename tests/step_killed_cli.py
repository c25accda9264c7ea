"""``kafka-cleaner`` SIGKILLed by itself just before its N-th durable step, so that a crash
test's kill lands on an event of the command, not on a moment of the clock: mid-clean on a
machine of any speed or load.

    python step_killed_cli.py N clean LOG_DIR --policy ...

The steps are those of ``faults.StepFaults``: every call to the durable-file layer
(``cleaner.storage.files``: renames, fsyncs, writes, removals, ...) and every data write of a
segment (``LogSegment.append``). ``N = 0`` kills nothing and writes how many steps the
command took to ``$STEP_COUNT_FILE`` when it exits.

This is the real command (``cleaner.cli.main``): the wrappers count and kill, nothing else.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

from faults import ALL_DURABLE_STEPS, APPEND, StepFaults


def run(arguments: list[str], kill_at: int, step_count_file: Path, **popen: object) -> subprocess.Popen[bytes]:
    """Start ``kafka-cleaner *arguments``, to be SIGKILLed just before its ``kill_at``-th
    step (0: not killed, and the steps it took written to ``step_count_file``)."""
    # The script's own directory is not on sys.path under PYTHONSAFEPATH (the Makefile sets it).
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "STEP_COUNT_FILE": str(step_count_file)}
    return subprocess.Popen([sys.executable, __file__, str(kill_at), *arguments], env=env, **popen)


def _sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install(at: int) -> None:
    steps = StepFaults(at=at or None, action=_sigkill, names=ALL_DURABLE_STEPS, extra=[APPEND])
    steps.install(types.SimpleNamespace(setattr=setattr))  # for good: the process ends with the command
    if not at:
        count_file = Path(os.environ["STEP_COUNT_FILE"])
        atexit.register(lambda: count_file.write_text(str(steps.calls)))


if __name__ == "__main__":
    _install(int(sys.argv[1]))
    from cleaner.cli import main

    sys.argv = ["kafka-cleaner", *sys.argv[2:]]
    main()
