"""Stage mode with a simulated broker (``SimBroker``: appends, rolls, truncates, applies
retention and checkpoints as Kafka does, and holds ``.lock`` from another process while it
runs). What a broker starting on a directory would serve is computed by applying Kafka's
start-up rules to a copy (``consumer_view``) and compared with the broker's own log (a twin
that got the same writes and no sidecar): no record lost, duplicated or resurrected.

The claims:
- while the broker may run, nothing it reads changes: the partition dirs' regular files
  are byte-identical and Kafka's start-up has nothing to do (no ``.swap``/``.cleaned``/
  ``.deleted``); everything staged is in ``.kafka-cleaner-stage/``;
- a broker restarted in place (the sidecar keeps running) meets nothing new;
- a pod restart (the sidecar's SIGTERM after the broker exited, or the next sidecar's
  start-up gate) commits every valid set under ``.lock``;
- each stale case makes the commit delete the set, and the broker's log stays as it was.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest
from broker_lock import BrokerLock, lock_is_free_for_another_process
from faults import StepFaults
from kafka_logs import consumer_view, leftover_files
from sidecar_helpers import (
    SimBroker,
    new_sidecar,
    next_scan,
    status_of,
    write_policy,
)

from cleaner.clock import MockTime
from cleaner.sidecar import stage
from cleaner.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.loader import startup_plan_for
from cleaner.storage.metadata import LEADER_EPOCH_CHECKPOINT, read_leader_epoch_checkpoint
from cleaner.storage.topic_partition import TopicPartition

COMPACT = [{"match": "topic-.*", "cleanupPolicy": "compact"}]
GENERATED = {"topics": 1, "partitions": 2, "records": 4_000, "keys": 1_500, "transactions": 0.1, "idempotent": True}


def _partitions(log_dir: Path) -> list[Path]:
    return sorted(p for p in log_dir.iterdir() if p.is_dir())


def _sets(log_dir: Path) -> dict[str, stage.StagedSet]:
    return {p.name: s for p in _partitions(log_dir) if (s := stage.load(p)) is not None}


def broker_files(log_dir: Path) -> dict[str, tuple]:
    """Everything a broker could notice in ``log_dir``: every file and directory but the
    stage areas and ``.lock``, each with its kind, inode, owner, group and mode, and for a
    file its size, mtime and SHA-256. Directories are listed too: a partition dir re-created
    with the same files, a file rewritten with the same bytes, a changed owner or mode are
    each a difference (a listing of file names and bytes misses all of them)."""
    out: dict[str, tuple] = {}
    for root, dirs, names in os.walk(log_dir):
        dirs[:] = [d for d in dirs if d != stage.STAGE_DIR]
        for name in dirs + names:
            p = Path(root) / name
            rel = str(p.relative_to(log_dir))
            if rel == ".lock":
                continue
            st = p.lstat()
            if stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_ino, st.st_uid, st.st_gid, st.st_mode)
            else:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel] = ("file", st.st_ino, st.st_uid, st.st_gid, st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def assert_invisible(log_dir: Path) -> None:
    """A broker starting now would find nothing of ours: no start-up work in any partition."""
    for pdir in _partitions(log_dir):
        plan = startup_plan_for(pdir)
        assert plan.is_empty, (pdir.name, plan.notes)
    assert leftover_files(log_dir) == [], "a temporary file outside the stage areas"


def views(log_dir: Path) -> dict[str, dict]:
    out = {}
    for pdir in _partitions(log_dir):
        view = consumer_view(pdir)
        assert view.problems == [], (pdir.name, view.problems)
        out[pdir.name] = view.live
    return out


class Pod:
    """A broker pod: the log dir, a twin that gets the same broker writes and no sidecar,
    the broker (lock + SimBroker) and the stage-mode sidecar."""

    def __init__(self, tmp_path: Path, make_log_dir, generated: dict | None = None, **policy: object) -> None:
        self.tmp = tmp_path
        self.data = make_log_dir(**{**GENERATED, **(generated or {})})
        self.twin = tmp_path / "twin"
        shutil.copytree(self.data, self.twin)
        self.policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=COMPACT, **policy)
        self.lock: BrokerLock | None = None
        self.brokers: list[SimBroker] = []
        self.clock = MockTime(1_700_000_000_000)
        self.start_broker()
        self.tps = sorted(self.brokers[0].logs, key=str)
        self.sc = new_sidecar(self.policy, [self.data], self.clock)

    def start_broker(self) -> None:
        """The broker's start: it takes ``.lock`` and loads its logs (Kafka's start-up rules)."""
        self.lock = BrokerLock(self.data).acquire()
        self.brokers = [SimBroker(self.data, seed=5), SimBroker(self.twin, seed=5)]

    def stop_broker(self) -> None:
        for b in self.brokers:
            b.close()
        assert self.lock is not None
        self.lock.release()
        self.lock = None

    def broker(self, op: str, tp: TopicPartition, *args: object, **kwargs: object) -> None:
        for b in self.brokers:
            getattr(b, op)(tp, *args, **kwargs)

    def new_sidecar(self) -> None:
        """The pod's next sidecar (its gate runs at the first tick)."""
        self.sc = new_sidecar(self.policy, [self.data], self.clock)

    def stage_all(self) -> dict[str, stage.StagedSet]:
        """Ticks until every partition has a set (the broker running), checking on every
        tick that the broker would see nothing."""
        for _ in range(2 + len(self.tps)):
            before = broker_files(self.data)
            next_scan(self.sc)
            assert broker_files(self.data) == before, "a file the broker reads changed"
            assert_invisible(self.data)
        sets = _sets(self.data)
        assert set(sets) == {str(tp) for tp in self.tps}
        return sets


def test_staging_while_the_broker_serves_is_invisible_and_an_in_place_restart_commits_nothing(
    tmp_path: Path, make_log_dir
) -> None:
    pod = Pod(tmp_path, make_log_dir)
    doc = next_scan(pod.sc)
    assert doc["gate"]["state"] == "open" and doc["gate"]["committed"] == 0  # nothing staged yet
    sets = pod.stage_all()
    doc = status_of(pod.sc)
    assert doc["cleaner"]["stagedBytes"] == sum(s.staged_bytes for s in sets.values()) > 0
    assert doc["stage"]["sets"] == 2 and doc["stage"]["refused"] == []
    assert not (pod.data / CLEANER_OFFSET_CHECKPOINT).exists()

    # More traffic, a roll: the sets stay valid (they are below the high watermark).
    for tp in pod.tps:
        pod.broker("append", tp, 40, tombstones=4)
        pod.broker("roll", tp)
        pod.broker("append", tp, 10)
    next_scan(pod.sc)
    assert _sets(pod.data) == sets

    # The broker restarts in place: the lock is free for a moment, the sidecar keeps running.
    pod.stop_broker()
    before = broker_files(pod.data)  # with what the broker's shutdown wrote
    for _ in range(3):
        next_scan(pod.sc)
        assert broker_files(pod.data) == before, "something was committed while the broker restarted in place"
    assert lock_is_free_for_another_process(pod.data)
    pod.start_broker()
    before = broker_files(pod.data)
    next_scan(pod.sc)
    assert broker_files(pod.data) == before and _sets(pod.data) == sets
    assert views(pod.data) == views(pod.twin)
    pod.stop_broker()


@pytest.mark.parametrize("how", ["termination", "gate"])
def test_a_pod_restart_commits_every_valid_set(tmp_path: Path, make_log_dir, how: str) -> None:
    """termination: the sidecar's SIGTERM after the broker exited; gate: the sidecar was
    killed, and the next pod's sidecar commits before its broker starts."""
    pod = Pod(tmp_path, make_log_dir)
    next_scan(pod.sc)
    sets = pod.stage_all()
    for tp in pod.tps:
        pod.broker("append", tp, 30, tombstones=3)
    pod.stop_broker()
    size_before = sum(p.stat().st_size for p in pod.data.glob("*/*.log"))
    if how == "termination":
        pod.sc.stop()
        result = pod.sc._controller.commits
        assert [c["committed"] for c in result] == [sorted(sets)]
    else:
        pod.new_sidecar()
        pod.sc.tick()
        doc = status_of(pod.sc)
        assert doc["gate"]["state"] == "open" and doc["gate"]["committed"] == 2 and doc["gate"]["deleted"] == 0
        assert doc["cleaner"]["bytesReclaimedTotal"] > 0
    assert _sets(pod.data) == {}
    assert all(stage.cleaned_to(pod.data / name) == s.end_offset for name, s in sets.items())
    assert lock_is_free_for_another_process(pod.data)  # the .lock stays: the broker's file (lock.py)
    assert sum(p.stat().st_size for p in pod.data.glob("*/*.log")) < size_before
    assert_invisible(pod.data)
    assert views(pod.data) == views(pod.twin)
    pod.start_broker()  # the broker starts on the committed log and goes on
    for tp in pod.tps:
        pod.broker("append", tp, 20, tombstones=2)
    assert views(pod.data) == views(pod.twin)
    pod.stop_broker()


def _retention(pod: Pod, tp: TopicPartition) -> None:
    pod.broker("retention", tp, 1)
    assert tp not in OffsetCheckpointFile(pod.data / LOG_START_OFFSET_CHECKPOINT).read(), (
        "Kafka writes no log start entry after ordinary retention"
    )


def _truncation(pod: Pod, tp: TopicPartition) -> None:
    s = stage.load(pod.data / tp.dir_name)
    assert s is not None
    pod.broker("truncate", tp, s.next_offset - 30)
    pod.broker("append", tp, 20)


def _broker_compacted(pod: Pod, tp: TopicPartition) -> None:
    # The broker's own cleaner ran on the partition (its checkpoint is what it leaves).
    OffsetCheckpointFile(pod.data / CLEANER_OFFSET_CHECKPOINT).write({tp: 100})


def _leader_epoch_moved(pod: Pod, tp: TopicPartition) -> None:
    """A leader change whose first offset falls inside the staged range (what an unclean
    election's truncation leaves in leader-epoch-checkpoint)."""
    pdir = pod.data / tp.dir_name
    s = stage.load(pdir)
    assert s is not None
    entries = [(e.epoch, e.start_offset) for e in read_leader_epoch_checkpoint(pdir)]
    entries.append((entries[-1][0] + 1, s.next_offset - 10))
    body = "".join(f"{e} {o}\n" for e, o in entries)
    (pdir / LEADER_EPOCH_CHECKPOINT).write_text(f"0\n{len(entries)}\n{body}")


def _high_watermark_went_back(pod: Pod, tp: TopicPartition) -> None:
    s = stage.load(pod.data / tp.dir_name)
    assert s is not None
    pod.brokers[0].set_high_watermark(tp, s.high_watermark - 5)


STALE = {
    "retention deleted a source segment": (_retention, "the first segment is now"),
    "a truncation": (_truncation, "changed (size, mtime_ns, last_batch_crc)"),
    "the broker compacted the partition": (_broker_compacted, "cleaner-offset-checkpoint"),
    "the leader epoch moved": (_leader_epoch_moved, "leader epochs"),
    "the high watermark went back": (_high_watermark_went_back, "high watermark went back"),
}


@pytest.mark.parametrize("case", sorted(STALE))
def test_each_stale_case_makes_the_gate_delete_the_set(tmp_path: Path, make_log_dir, case: str) -> None:
    pod = Pod(tmp_path, make_log_dir)
    next_scan(pod.sc)
    pod.stage_all()
    a = pod.tps[0]
    change, reason = STALE[case]
    change(pod, a)
    pod.stop_broker()
    del pod.sc  # killed: no termination commit
    expected = broker_files(pod.data)
    pod.new_sidecar()
    pod.sc.tick()
    doc = status_of(pod.sc)
    assert doc["gate"]["committed"] == 1 and doc["gate"]["deleted"] == 1, doc["gate"]
    deleted = [e for e in doc["errors"] if e["partition"] == str(a) and "deleted the staged set" in e["message"]]
    assert deleted and reason in deleted[0]["message"], doc["errors"]
    assert _sets(pod.data) == {}
    assert stage.cleaned_to(pod.data / a.dir_name) is None
    now = broker_files(pod.data)
    in_a = [k for k in expected if k == a.dir_name or k.startswith(a.dir_name + "/")]
    assert in_a and {k: now.get(k) for k in in_a} == {k: expected[k] for k in in_a}, "the stale partition changed"
    assert [k for k in now if k.startswith(a.dir_name + "/") and k not in expected] == [], "a new file in it"
    assert_invisible(pod.data)
    if case != "the broker compacted the partition":  # the simulated broker does not compact
        assert views(pod.data) == views(pod.twin)


def test_a_broker_holding_the_lock_wins_the_gate(tmp_path: Path, make_log_dir) -> None:
    """The broker started first (or the sidecar alone restarted): the gate commits nothing
    and opens at once."""
    pod = Pod(tmp_path, make_log_dir)
    next_scan(pod.sc)
    sets = pod.stage_all()
    before = broker_files(pod.data)
    pod.new_sidecar()
    pod.sc.tick()
    doc = status_of(pod.sc)
    assert doc["gate"]["state"] == "open" and doc["gate"]["committed"] == 0
    assert doc["gate"]["lockHeldByBroker"] == [str(pod.data)]
    assert broker_files(pod.data) == before and _sets(pod.data) == sets
    pod.sc.stop()  # SIGTERM with the broker still running: nothing either
    assert broker_files(pod.data) == before and _sets(pod.data) == sets
    pod.stop_broker()


class _SlowClock(MockTime):
    """Each look at the monotonic clock takes 600 ms: the gate's deadline passes after the
    first set."""

    def nanoseconds(self) -> int:
        self.advance(600)
        return super().nanoseconds()


def test_the_gate_stops_at_max_commit_seconds_and_commits_nothing_more(tmp_path: Path, make_log_dir) -> None:
    pod = Pod(tmp_path, make_log_dir, stage={"maxCommitSeconds": 1})
    next_scan(pod.sc)
    sets = pod.stage_all()
    pod.stop_broker()
    del pod.sc
    pod.clock = _SlowClock(pod.clock.milliseconds())
    pod.new_sidecar()
    pod.sc.tick()
    doc = status_of(pod.sc)
    assert doc["gate"]["committed"] == 1 and doc["gate"]["timedOut"] == 1, doc["gate"]
    left = _sets(pod.data)
    assert len(left) == 1 and left == {k: v for k, v in sets.items() if k in left}, "a set was half-committed"
    assert_invisible(pod.data)
    assert views(pod.data) == views(pod.twin)


def _same_files(log_dir: Path) -> None:
    """A copy of a log dir holds the same bytes and mtimes in new inodes: tell its sets so
    (what the sets record about their sources is otherwise unchanged)."""
    for pdir in _partitions(log_dir):
        s = stage.load(pdir)
        if s is None:
            continue
        fresh = [stage.SourceFile.of(pdir / src.name) for src in s.sources]
        assert [(f.size, f.mtime_ns, f.last_batch_crc) for f in fresh] == [
            (src.size, src.mtime_ns, src.last_batch_crc) for src in s.sources
        ]
        s.sources = fresh
        (stage.set_dir(pdir) / stage.MANIFEST).write_bytes(s.to_json())


@pytest.mark.slow
def test_a_commit_interrupted_at_any_step_leaves_a_log_kafka_starts_on(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error (the sidecar killed) at every durable step of the gate's commit: a
    broker starting on what is left serves exactly its own log's latest values, and the
    next gate finishes the job (or deletes what can no longer be committed)."""
    pod = Pod(tmp_path, make_log_dir, generated={"partitions": 1, "records": 2_500})
    next_scan(pod.sc)
    pod.stage_all()
    pod.stop_broker()
    del pod.sc
    staged = tmp_path / "staged"
    shutil.copytree(pod.data, staged)
    expected = views(pod.twin)
    policy = pod.policy

    def attempt(at: int | None) -> StepFaults:
        work = tmp_path / f"work-{at}"
        shutil.copytree(staged, work)
        _same_files(work)
        sc = new_sidecar(policy, [work])
        faults = StepFaults(at, names=("rename", "write_file", "atomic_write", "remove", "fsync_dir")).install(
            monkeypatch
        )
        sc.tick()
        monkeypatch.undo()
        assert views(work) == expected, f"interrupted at step {at}: {faults.log[:at]}"
        assert lock_is_free_for_another_process(work)
        new_sidecar(policy, [work]).tick()  # the next pod's gate
        assert _sets(work) == {} and views(work) == expected
        assert_invisible(work)
        shutil.rmtree(work)
        return faults

    steps = attempt(None).calls
    assert steps >= 10
    for at in range(1, steps + 1):
        attempt(at)


def test_leaving_stage_mode_deletes_the_sets(tmp_path: Path, make_log_dir) -> None:
    pod = Pod(tmp_path, make_log_dir)
    next_scan(pod.sc)
    pod.stage_all()
    before = broker_files(pod.data)
    write_policy(pod.policy, mode="observe", topics=COMPACT, generation=2)
    doc = next_scan(pod.sc, 60_000)
    assert doc["mode"] == "observe"
    assert _sets(pod.data) == {} and broker_files(pod.data) == before
    assert all(not stage.area(p).exists() or not any(stage.area(p).iterdir()) for p in _partitions(pod.data))
    pod.stop_broker()


def test_a_restarted_sidecar_keeps_valid_sets_and_deletes_stale_ones(tmp_path: Path, make_log_dir) -> None:
    """Killed and restarted next to the running broker: its gate meets the broker's lock;
    the sets it finds are validated on every turn, and a stale one goes at once."""
    pod = Pod(tmp_path, make_log_dir)
    next_scan(pod.sc)
    sets = pod.stage_all()
    del pod.sc
    pod.new_sidecar()
    pod.sc.tick()
    doc = next_scan(pod.sc)
    assert _sets(pod.data) == sets
    assert doc["cleaner"]["stagedBytes"] == sum(s.staged_bytes for s in sets.values())
    a = pod.tps[0]
    _truncation(pod, a)
    doc = next_scan(pod.sc)
    assert any("deleted the staged set" in e["message"] and e["partition"] == str(a) for e in doc["errors"])
    new = _sets(pod.data).get(str(a))
    assert new is None or new.created_at_ms > sets[str(a)].created_at_ms
    assert views(pod.data) == views(pod.twin)
    pod.stop_broker()


def test_pause_stages_nothing_and_keeps_validating(tmp_path: Path, make_log_dir) -> None:
    pod = Pod(tmp_path, make_log_dir)
    next_scan(pod.sc)
    pod.stage_all()
    write_policy(pod.policy, mode="stage", topics=COMPACT, paused=True, generation=2)
    assert next_scan(pod.sc, 60_000)["cleaner"]["state"] == "paused"
    a = pod.tps[0]
    _retention(pod, a)
    next_scan(pod.sc)
    assert str(a) not in _sets(pod.data)
    next_scan(pod.sc)
    assert str(a) not in _sets(pod.data), "paused, but staged again"
    pod.stop_broker()


def test_never_stages_at_or_above_the_high_watermark_or_an_open_transaction(tmp_path: Path, make_log_dir) -> None:
    pod = Pod(tmp_path, make_log_dir)
    a, b = pod.tps
    for tp in pod.tps:  # closed segments above where the broker will put the HW / LSO
        for _ in range(4):
            pod.broker("append", tp, 30)
            pod.broker("roll", tp)
    hw = pod.brokers[0].logs[a].segments[-3].base_offset + 7
    pod.broker("set_high_watermark", a, hw)
    lso = pod.brokers[0].log_end_offset(b)
    pod.broker("append", b, 5, is_transactional=True, producer_id=9_999, producer_epoch=0, base_sequence=0)
    for _ in range(3):
        pod.broker("append", b, 30)
        pod.broker("roll", b)
    next_scan(pod.sc)
    sets = pod.stage_all()
    assert sets[str(a)].next_offset <= hw and sets[str(a)].high_watermark == hw
    assert sets[str(b)].next_offset <= lso
    pod.stop_broker()


def test_without_a_gate_nothing_is_committed_at_start(tmp_path: Path, make_log_dir) -> None:
    """``--no-gate``: a sidecar that does not start before the broker commits nothing at its
    start, even with the lock free."""
    pod = Pod(tmp_path, make_log_dir)
    next_scan(pod.sc)
    sets = pod.stage_all()
    pod.stop_broker()
    del pod.sc
    before = broker_files(pod.data)
    sc = new_sidecar(pod.policy, [pod.data], pod.clock)
    sc.options.gate = False
    sc.tick()
    doc = status_of(sc)
    assert doc["gate"]["state"] == "open" and "--no-gate" in doc["gate"]["skipped"]
    assert broker_files(pod.data) == before and _sets(pod.data) == sets


def test_a_deleted_policy_deletes_the_sets_and_commits_nothing(tmp_path: Path, make_log_dir) -> None:
    """The policy's file disappears (the policy and its ConfigMap were deleted): the sets
    go at once, and the pod's termination commits nothing."""
    pod = Pod(tmp_path, make_log_dir)
    next_scan(pod.sc)
    pod.stage_all()
    pod.policy.unlink()
    doc = next_scan(pod.sc, 60_000)
    assert _sets(pod.data) == {}
    assert any("the policy file is gone" in e["message"] for e in doc["errors"]), doc["errors"]
    pod.stop_broker()
    before = broker_files(pod.data)
    pod.sc.stop()
    assert broker_files(pod.data) == before
    assert views(pod.data) == views(pod.twin)


def test_a_policy_file_that_goes_and_comes_back_resumes_staging(tmp_path: Path, make_log_dir) -> None:
    pod = Pod(tmp_path, make_log_dir)
    next_scan(pod.sc)
    pod.stage_all()
    text = pod.policy.read_text()
    pod.policy.unlink()
    next_scan(pod.sc, 60_000)
    assert _sets(pod.data) == {} and status_of(pod.sc)["cleaner"]["state"] == "idle"
    pod.policy.write_text(text)
    next_scan(pod.sc, 60_000)
    pod.stage_all()
    pod.stop_broker()
