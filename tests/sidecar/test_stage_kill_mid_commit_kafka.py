"""``kill -9`` of a stage commit that is provably *inside* the commit, then the real broker
of each line starts on what is left and serves every latest value.

The commit (``kafka-cleaner stage commit``, the broker stopped) runs under an audit hook
(``sys.addaudithook``: Python reports every ``os.link``, ``os.rename``, ``os.remove``,
``os.rmdir`` and ``shutil.rmtree`` before doing it). The hook writes each step to an audit
file, and at a chosen step writes ``PAUSE <step>`` and waits: the test kills the process
there, so the kill lands after every earlier step and before that one (no timing guess,
no strace). The instants are the commit's intermediate states:

- ``linked``: the staged segments are linked into the partition dir as ``.cleaned``,
  nothing swapped (Kafka's start-up deletes them: the old log);
- ``swapping``: the first ``.cleaned`` renamed to ``.swap`` (start-up completes or undoes
  the swap, Kafka's rules);
- ``swapped``: the old segments renamed ``.deleted`` and the first ``.swap`` about to become
  the segment (committed: start-up completes it);
- ``between partitions``: one partition committed (its ``cleaned-to`` written, its set
  deleted), the next partition's set untouched.

For each, the test asserts the audit shows the commit stopped at that step with steps done
before it, and that the directory is that intermediate state; then the broker starts and
serves every key's latest value with the same earliest and latest offsets.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kafka_broker import EACH_KAFKA_LINE, wait_until
from sidecar_helpers import write_policy
from test_stage_kafka import (
    PARTITIONS,
    POLICY_TOPICS,
    TOPIC,
    _serves_everything,
    _sidecar,
    _stage_while_serving,
    _start,
)

from cleaner.sidecar import stage
from cleaner.storage.segment import CLEANED_SUFFIX, DELETED_SUFFIX, SWAP_SUFFIX

pytestmark = [pytest.mark.slow, EACH_KAFKA_LINE]

AUDITED = """
import os, re, signal, sys

audit, pause, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
EVENTS = {"os.link", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree"}
fd = os.open(audit, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
seen = 0

def hook(event, args):
    global seen
    if event not in EVENTS:
        return
    line = event + " " + " ".join(os.fsdecode(a) for a in args if isinstance(a, (str, bytes, os.PathLike)))
    if pause and re.search(pause, line):
        seen += 1
        if seen == nth:
            os.write(fd, ("PAUSE " + line + "\\n").encode())
            while True:
                signal.pause()
    os.write(fd, (line + "\\n").encode())

sys.addaudithook(hook)
sys.argv = ["kafka-cleaner"] + sys.argv[4:]
from cleaner.cli import main
main()
"""

INSTANTS = {
    # name: (the step the commit is stopped before, which occurrence of it); the first runs
    # on two fresh sets, so the first partition is committed, not found stale
    "between partitions": (rf"^os\.link \S+/{TOPIC}-1/{re.escape(stage.STAGE_DIR)}/", 1),
    "linked": (rf"^os\.rename \S+{re.escape(CLEANED_SUFFIX)} \S+{re.escape(SWAP_SUFFIX)}$", 1),
    "swapping": (rf"^os\.rename \S+{re.escape(CLEANED_SUFFIX)} \S+{re.escape(SWAP_SUFFIX)}$", 2),
    "swapped": (rf"^os\.rename \S+{re.escape(SWAP_SUFFIX)} \S+$", 1),
}


def _kafka_names(pdir: Path) -> list[str]:
    return sorted(p.name for p in pdir.iterdir() if p.is_file())


def _unfinished(pdir: Path) -> list[str]:
    return [n for n in _kafka_names(pdir) if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX))]


def _assert_intermediate(instant: str, log_dir: Path, paused: str, cleaned_to: dict[str, int | None]) -> None:
    """The directory is the commit's state at ``instant`` (``paused``: the step it was
    stopped before; ``cleaned_to``: each partition's before the commit)."""
    if instant == "between partitions":
        first, second = log_dir / f"{TOPIC}-0", log_dir / f"{TOPIC}-1"
        assert _unfinished(first) == [] and stage.load(first) is None, _kafka_names(first)
        assert stage.cleaned_to(first) not in (None, cleaned_to[first.name]), "the first partition not committed"
        assert _unfinished(second) == [] and stage.load(second) is not None, "the second partition touched"
        assert stage.cleaned_to(second) == cleaned_to[second.name]
        return
    pdir = Path(paused.split()[1]).parent
    assert pdir.parent == log_dir, paused
    names = _kafka_names(pdir)
    cleaned = [n for n in names if n.endswith(CLEANED_SUFFIX)]
    swap = [n for n in names if n.endswith(SWAP_SUFFIX)]
    deleted = [n for n in names if n.endswith(DELETED_SUFFIX)]
    if instant == "linked":
        assert cleaned and not swap and not deleted, names
    elif instant == "swapping":
        assert cleaned and swap and not deleted, names
    else:
        assert swap and deleted and not cleaned, names
    assert stage.load(pdir) is not None and stage.cleaned_to(pdir) == cleaned_to[pdir.name], "past the commit"


def _commit_killed_at(tmp_path: Path, log_dir: Path, policy: Path, instant: str) -> list[str]:
    """Run the commit until it is about to take ``instant``'s step, SIGKILL it there, and
    return its audit (the last line: ``PAUSE <step>``)."""
    pattern, nth = INSTANTS[instant]
    audit = tmp_path / f"audit-{instant.replace(' ', '-')}"
    command = ["stage", "commit", str(log_dir), "--policy", str(policy)]
    proc = subprocess.Popen(
        [sys.executable, "-c", AUDITED, str(audit), pattern, str(nth), *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(
            lambda: proc.poll() is not None or (audit.exists() and "PAUSE " in audit.read_text()),
            f"the commit at its {instant} step",
            120,
        )
        assert proc.poll() is None, f"the commit ended before its {instant} step: {proc.stderr.read().decode()}"  # type: ignore[union-attr]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    steps = audit.read_text().splitlines()
    assert steps[-1].startswith("PAUSE ") and re.search(pattern, steps[-1][len("PAUSE ") :]), steps[-3:]
    assert sum(1 for s in steps if not s.startswith("PAUSE ")) >= 1, "the kill did not land inside the commit"
    return steps


def test_sigkill_inside_the_commit_then_the_broker_serves_every_latest_value(tmp_path: Path, line: str) -> None:
    broker, work = _start(tmp_path, line)
    policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=POLICY_TOPICS)
    for instant in INSTANTS:
        sets = _stage_while_serving(_sidecar(tmp_path, broker), broker, work)
        assert len(sets) == PARTITIONS
        offsets = broker.offsets(TOPIC, PARTITIONS)
        before = {p.name: stage.cleaned_to(p) for p in broker.log_dir.glob(f"{TOPIC}-*")}
        broker.stop()
        steps = _commit_killed_at(tmp_path, broker.log_dir, policy, instant)
        _assert_intermediate(instant, broker.log_dir, steps[-1][len("PAUSE ") :], before)
        broker.start()
        _serves_everything(broker, work, offsets)
        work.produce(600)
    broker.stop()
