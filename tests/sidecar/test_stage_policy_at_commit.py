"""Every commit obeys the policy and the cluster's topic config in force at commit time (issue
21, item 3): the start-up gate, the termination commit and ``kafka-cleaner stage commit``
re-read the policy file and the KRaft metadata right before each set, and a set the policy no
longer stages (rule gone, no longer compacted, paused, not stage mode, the file deleted), whose
topic the cluster now says ``delete`` (or compacts itself), or whose effective
``delete.retention.ms`` / ``min.compaction.lag.ms`` is no longer what it was cleaned under, is
discarded, never committed: the partition's files stay byte for byte as they were. A policy
change aborts a (throttled) staging round at once, on the test clock."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from broker_lock import BrokerLock
from click.testing import CliRunner
from metadata_logs import config_record, topic_record, write_metadata_log
from sidecar_helpers import NOW_MS, new_sidecar, next_scan, status_of, write_policy

from cleaner.cli import main
from cleaner.clock import MockTime
from cleaner.sidecar import service, stage

TOPICS = [{"match": "topic-.*", "cleanupPolicy": "compact"}]
METADATA_LOG = Path("__cluster_metadata-0") / "00000000000000000000.log"
TOPIC_ID = uuid.UUID(int=7)

#: What changes in the policy between staging and the commit -> write_policy's arguments.
CHANGES: dict[str, dict[str, Any]] = {
    "rule-removed": {"topics": [{"match": "other-.*", "cleanupPolicy": "compact"}]},
    "rule-says-delete": {"topics": [{"match": "topic-.*", "cleanupPolicy": "delete"}]},
    "paused": {"paused": True},
    "mode-observe": {"mode": "observe"},
    "longer-delete-retention": {"topics": [{**TOPICS[0], "deleteRetentionMs": 2 * 86_400_000}]},
    "longer-min-lag": {"topics": [{**TOPICS[0], "minCompactionLagMs": 3_600_000}]},
    "deleted": {},
}


def _partitions(data: Path) -> list[Path]:
    return sorted(p for p in data.iterdir() if p.is_dir() and p.name.startswith("topic-"))


def _broker_files(data: Path) -> dict[str, Any]:
    """Every entry of every partition dir but the stage area, regular files by content: what
    a broker starting on the dir would see (a re-created or added directory shows too)."""
    out: dict[str, Any] = {}
    for pdir in _partitions(data):
        for entry in sorted(os.scandir(pdir), key=lambda e: e.name):
            if entry.name == stage.STAGE_DIR:
                continue
            key = f"{pdir.name}/{entry.name}"
            if entry.is_file(follow_symlinks=False):
                out[key] = hashlib.sha256(Path(entry.path).read_bytes()).hexdigest()
            else:
                out[key] = "dir"
    return out


def _sets(data: Path) -> list[str]:
    return [p.name for p in _partitions(data) if stage.load(p) is not None]


def _stage(tmp_path: Path, make_log_dir, *, metadata: list[bytes] | None = None) -> tuple[Path, Path, Any]:
    """Two partitions staged by a stage-mode sidecar next to a (simulated) running broker;
    the sidecar is returned unstopped (nothing committed), the broker stopped."""
    data = make_log_dir(topics=1, partitions=2, records=4_000, keys=300)
    if metadata is not None:
        (data / METADATA_LOG).parent.mkdir()
        write_metadata_log(data / METADATA_LOG, metadata)
    policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=TOPICS)
    with BrokerLock(data):
        sc = new_sidecar(policy, [data])
        for _ in range(5):
            next_scan(sc)
            if len(_sets(data)) == 2:
                break
    assert _sets(data) == ["topic-0-0", "topic-0-1"], "the sidecar staged no sets"
    return data, policy, sc


def _change(policy: Path, change: str) -> None:
    if change == "deleted":
        policy.unlink()
        return
    kwargs: dict[str, Any] = {"mode": "stage", "topics": TOPICS, **CHANGES[change]}
    write_policy(policy, generation=2, **kwargs)


def _assert_discarded(data: Path, before: dict[str, Any]) -> None:
    assert _broker_files(data) == before, "a set was committed under a policy that no longer stages it"
    assert _sets(data) == [], "a set no longer wanted was left staged"
    for pdir in _partitions(data):
        assert not (stage.area(pdir) / stage.WORK_DIR).exists()


def _discarded_metric(sc) -> float:
    registry = sc.metrics.registry
    return sum(
        s.value
        for m in registry.collect()
        if m.name == "kafka_cleaner_stage_sets_discarded"
        for s in m.samples
        if s.name.endswith("_total")
    )


# -- the start-up gate --------------------------------------------------------------------------


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_gate_discards_what_the_policy_no_longer_stages(tmp_path: Path, make_log_dir, change: str) -> None:
    data, policy, _ = _stage(tmp_path, make_log_dir)
    before = _broker_files(data)
    _change(policy, change)
    sc = new_sidecar(policy, [data])  # the pod restarts: the broker is stopped, the gate runs
    for _ in range(3):
        sc.tick()
        if sc.gate.open:
            break
    assert sc.gate.open
    _assert_discarded(data, before)
    if change in ("deleted", "mode-observe"):
        return  # no stage controller to report it; the log says it
    doc = status_of(sc)
    [commit] = doc["stage"]["lastCommit"]
    assert sorted(d["partition"] for d in commit["discarded"]) == ["topic-0-0", "topic-0-1"], commit
    assert commit["committed"] == [] and all(d["reason"] for d in commit["discarded"]), commit
    assert doc["gate"]["discarded"] == 2, doc["gate"]
    assert _discarded_metric(sc) == 2


# -- the termination commit ---------------------------------------------------------------------


@pytest.mark.parametrize("polled", [False, True], ids=["unpolled", "polled"])
@pytest.mark.parametrize("change", ["rule-removed", "paused", "longer-delete-retention", "deleted"])
def test_the_termination_commit_obeys_the_policy_in_force(
    tmp_path: Path, make_log_dir, change: str, polled: bool
) -> None:
    data, policy, sc = _stage(tmp_path, make_log_dir)
    before = _broker_files(data)
    _change(policy, change)
    if polled:  # the sidecar has seen the change, and SIGTERM comes after
        with BrokerLock(data):
            next_scan(sc, service.POLICY_POLL_MS)
        if change == "longer-delete-retention":
            # Still staged: the old sets went at once, new ones are cleaned under the new config,
            # and those are what the termination commits.
            restaged = [stage.load(p) for p in _partitions(data)]
            assert all(s is None or s.cleaned_under["delete.retention.ms"] == 2 * 86_400_000 for s in restaged)
            assert _discarded_metric(sc) == 2
            sc.stop()
            assert _sets(data) == []
            return
    sc.stop()  # the broker has exited: the termination commit runs
    _assert_discarded(data, before)


def test_the_termination_commit_still_commits_what_the_policy_stages(tmp_path: Path, make_log_dir) -> None:
    data, policy, sc = _stage(tmp_path, make_log_dir)
    before = _broker_files(data)
    write_policy(policy, mode="stage", topics=TOPICS, generation=2, reporting={"topPartitions": 3})
    sc.stop()
    assert _sets(data) == [] and _broker_files(data) != before, "a wanted set was not committed"
    assert all(stage.cleaned_to(p) is not None for p in _partitions(data))


# -- kafka-cleaner stage commit -------------------------------------------------------------------


@pytest.mark.parametrize("change", sorted(set(CHANGES) - {"deleted"}))
def test_stage_commit_obeys_the_policy_file(tmp_path: Path, make_log_dir, change: str) -> None:
    data, policy, _ = _stage(tmp_path, make_log_dir)
    before = _broker_files(data)
    _change(policy, change)
    result = CliRunner().invoke(main, ["stage", "commit", str(data), "--policy", str(policy)])
    assert result.exit_code == 0, result.output
    _assert_discarded(data, before)
    assert "committed 0 set(s)" in result.output and "discarded 2" in result.output, result.output
    assert result.output.count("set discarded: ") == 2, result.output


def test_stage_commit_needs_the_policy(tmp_path: Path, make_log_dir) -> None:
    data, _, _ = _stage(tmp_path, make_log_dir)
    before = _broker_files(data)
    result = CliRunner().invoke(main, ["stage", "commit", str(data)])
    assert result.exit_code == 2 and "--policy" in result.output, result.output
    assert _broker_files(data) == before and len(_sets(data)) == 2


# -- the cluster's topic config -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cleanup.policy", "delete"),
        ("cleanup.policy", "compact"),  # the broker's own cleaner compacts it now
        ("delete.retention.ms", str(3 * 86_400_000)),
        ("min.compaction.lag.ms", "3600000"),
    ],
)
@pytest.mark.parametrize("how", ["gate", "cli"])
def test_a_topic_config_changed_in_the_cluster_is_not_committed(
    tmp_path: Path, make_log_dir, key: str, value: str, how: str
) -> None:
    data, policy, _ = _stage(tmp_path, make_log_dir, metadata=[topic_record("topic-0", TOPIC_ID)])
    before = _broker_files(data)
    # The controller appends the change (kafka-configs.sh --alter) while the sidecar is down.
    changed = [topic_record("topic-0", TOPIC_ID), config_record(2, "topic-0", key, value)]
    write_metadata_log(data / METADATA_LOG, changed)
    if how == "gate":
        sc = new_sidecar(policy, [data])
        for _ in range(3):
            sc.tick()
            if sc.gate.open:
                break
        assert sc.gate.open and sc.gate.result.get("discarded") == 2, sc.gate.result
    else:
        result = CliRunner().invoke(main, ["stage", "commit", str(data), "--policy", str(policy)])
        assert result.exit_code == 0 and "discarded 2" in result.output, result.output
        assert key in result.output or "compact" in result.output, result.output
    _assert_discarded(data, before)


def test_an_unchanged_cluster_config_commits(tmp_path: Path, make_log_dir) -> None:
    metadata = [topic_record("topic-0", TOPIC_ID), config_record(2, "topic-0", "delete.retention.ms", "172800000")]
    data, policy, _ = _stage(tmp_path, make_log_dir, metadata=metadata)
    for pdir in _partitions(data):
        staged = stage.load(pdir)
        assert staged is not None and staged.cleaned_under["delete.retention.ms"] == 172_800_000, staged
        assert staged.cleaned_under["clusterConfig"] is True
    result = CliRunner().invoke(main, ["stage", "commit", str(data), "--policy", str(policy)])
    assert result.exit_code == 0 and "committed 2 set(s)" in result.output, result.output


# -- a policy change during a throttled round ---------------------------------------------------


class WorkingClock(MockTime):
    """A mock clock on which work takes time (each reading of the monotonic clock is 20 ms
    later), so the cleaner's throttle really sleeps (on this clock); ``at(ms, action)`` runs
    ``action`` once, in the thread that moves the clock past ``ms``."""

    def __init__(self, ms: int) -> None:
        super().__init__(ms)
        self._actions: list[tuple[int, Any]] = []
        self.sleeps = 0

    def nanoseconds(self) -> int:
        self.advance(20)
        return super().nanoseconds()

    def sleep(self, ms: float) -> None:
        self.sleeps += 1
        super().sleep(ms)

    def at(self, ms: int, action) -> None:
        self._actions.append((ms, action))

    def advance(self, ms: float) -> None:
        super().advance(ms)
        due = [a for a in self._actions if a[0] <= self.milliseconds()]
        self._actions = [a for a in self._actions if a[0] > self.milliseconds()]
        for _, action in due:
            action()


@pytest.mark.parametrize("change", ["paused", "rule-removed", "deleted"])
def test_a_policy_change_aborts_a_throttled_staging_round_at_once(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    data = make_log_dir(topics=1, partitions=1, records=4_000, keys=300)
    policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=TOPICS, cleaner={"maxIoBytesPerSecond": 1_000})
    clock = WorkingClock(NOW_MS)
    changed_at: list[int] = []
    rounds: list[tuple[int, int, object, int]] = []
    real_stage_partition = stage.stage_partition

    def change_policy() -> None:
        changed_at.append(clock.milliseconds())
        _change(policy, change)

    def staging(*args: Any, **kwargs: Any) -> Any:
        started, sleeps = clock.milliseconds(), clock.sleeps
        if not rounds:
            clock.at(started + 60_000, change_policy)  # a minute into the (throttled) round
        outcome: object = "aborted"
        try:
            outcome = real_stage_partition(*args, **kwargs)
            return outcome
        finally:
            rounds.append((started, clock.milliseconds(), outcome, clock.sleeps - sleeps))

    monkeypatch.setattr(stage, "stage_partition", staging)
    with BrokerLock(data):
        sc = new_sidecar(policy, [data], clock)
        for _ in range(4):
            clock.advance(30_000)
            sc.tick()
            if rounds:
                break
        assert rounds, "no staging round ran"
        _, ended, outcome, slept = rounds[0]
        assert slept > 0, "the round was not throttled"
        assert changed_at, f"the round ended before the policy changed: {rounds}"
        assert outcome is None or outcome == "aborted", outcome
        assert ended - changed_at[0] <= service.POLICY_POLL_MS + 1_000, (
            f"the round went on {ended - changed_at[0]} ms after the policy changed"
        )
        pdir = data / "topic-0-0"
        assert stage.load(pdir) is None and not (stage.area(pdir) / stage.WORK_DIR).exists()
        # The next turn of the loop reloads the policy at once.
        clock.advance(1)
        sc.tick()
        if change == "deleted":
            assert sc._policy_gone
        else:
            assert sc.policy is not None and sc.policy.policy_generation == 2
        assert stage.load(pdir) is None
