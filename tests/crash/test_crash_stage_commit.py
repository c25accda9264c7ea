"""Stage mode's fenced commit (``cleaner.sidecar.stage.commit_log_dir``, what the start-up
gate and the sidecar's termination run) crashed after every file operation, judged with
Kafka's start-up under both persistence models.

The set is staged by a real stage-mode sidecar (in-process, mock clock) into the partition's
``.kafka-cleaner-stage/`` while nothing holds the log dir; the commit then takes ``.lock``,
validates the set, links its files in as ``.cleaned``, swaps them in with
``Log.replace_segments``, records ``cleaned-to`` and deletes the set. Whatever a crash leaves,
a broker starting on the partition must serve the old log or the new one, never a mix: the
stage area is a subdirectory, which Kafka's start-up never reads, so only the swap decides.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_lock import BrokerLock
from crash_check import SOAK, check_log_operation
from test_crash_swap import NOW_MS, log_dir

from cleaner.clock import MockTime
from cleaner.sidecar import stage
from cleaner.sidecar.guards import CommitCheck
from cleaner.sidecar.service import Sidecar, SidecarOptions

POLICY = """\
mode: stage
topics:
  - match: "t"
    cleanupPolicy: compact
    segmentBytes: 2200
    indexIntervalBytes: 256
stage:
  minFreeDiskRatio: 0
reporting:
  intervalSeconds: 10
"""


def _staged(tmp: Path, records: int, keys: int) -> Path:
    root = log_dir(tmp, seed=records, records=records, keys=keys)
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    clock = MockTime(NOW_MS)
    sidecar = Sidecar(SidecarOptions(policy, [str(root)], broker_name="kafka-0", listen=("127.0.0.1", 0)), clock)
    for _ in range(4):  # the gate (nothing staged yet), then staging rounds
        clock.advance(10_000)
        sidecar.tick()
        if stage.load(root / "t-0") is not None:
            break
    # The sidecar stops while the broker still runs (it holds ``.lock``): nothing committed.
    with BrokerLock(root):
        sidecar.stop()
    return root


@pytest.mark.parametrize(("records", "keys"), [(160, 8)] if not SOAK else [(160, 8), (600, 40)], ids=str)
def test_every_crash_of_the_stage_commit_leaves_the_old_log_or_the_new(tmp_path: Path, records: int, keys: int) -> None:
    root = _staged(tmp_path, records, keys)
    staged = stage.load(root / "t-0")
    assert staged is not None, "the sidecar staged no set"
    assert len(staged.replaced) >= 2, "a set replacing several segments, or the swap's order cannot matter"
    clock = MockTime(NOW_MS)
    report: list[stage.CommitReport] = []

    wanted = CommitCheck(tmp_path / "policy.yaml", [root])  # the policy in force, as the sidecar's commit

    def commit() -> None:
        report.append(stage.commit_log_dir(root, clock, deadline_ns=clock.nanoseconds() + 10**12, wanted=wanted))

    failures, recording = check_log_operation(root, ["t-0"], commit)
    assert report and report[0].committed and not report[0].errors, report
    assert not failures, "\n".join(failures)
    calls = [s.call for s in recording.steps]
    assert calls.count("link") >= 2 and "version" in calls, "the set came in through the durable-file layer"
