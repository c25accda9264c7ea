"""Stage mode next to a live broker: cleaned segments are left as complete ``.swap`` sets
for the broker's next start. At arbitrary moments (after staging, a truncation, retention,
a roll, a policy change) the sidecar validates, then Kafka's start-up rules are applied to
a copy of the directory (``consumer_view``/``broker_view``): no record may be lost,
duplicated or resurrected compared with the broker's own log (a twin that got the same
writes and no sidecar)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from faults import StepFaults
from kafka_logs import broker_view, consumer_view, leftover_files, snapshot_dir
from sidecar_helpers import (
    BrokerLock,
    SimBroker,
    new_sidecar,
    next_scan,
    status_of,
    write_policy,
)

from cleaner.sidecar import stage
from cleaner.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.topic_partition import TopicPartition

COMPACT = [{"match": "topic-.*", "cleanupPolicy": "compact"}]
GENERATED = {"topics": 1, "partitions": 2, "records": 4_000, "keys": 1_500, "transactions": 0.1, "idempotent": True}


def _partitions(log_dir: Path) -> list[Path]:
    return sorted(p for p in log_dir.iterdir() if p.is_dir())


def _sets(log_dir: Path) -> dict[str, stage.StagedSet]:
    return {p.name: s for p in _partitions(log_dir) if (s := stage.load_manifest(p)) is not None}


def _swaps(pdir: Path) -> list[str]:
    return sorted(p.name for p in pdir.iterdir() if p.name.endswith(".swap"))


def _differences(data: Path, twin: Path, brokers: dict[str, tuple[int, int]]) -> list[str]:
    """What a broker starting on ``data`` now would serve that differs from its own log
    (``twin``): latest value per key, offsets strictly increasing, nothing below the log
    start offset (retention) or at/above the log end offset (truncation).
    ``brokers``: partition dir name -> (log start offset, log end offset)."""
    problems = []
    for pdir in _partitions(data):
        if pdir.name not in brokers:
            continue
        mine, ref = consumer_view(pdir), consumer_view(twin / pdir.name)
        problems += [f"{pdir.name}: {p}" for p in mine.problems]
        if mine.live != ref.live:
            lost = set(ref.live) - set(mine.live)
            extra = set(mine.live) - set(ref.live)
            other = {k for k in set(ref.live) & set(mine.live) if ref.live[k] != mine.live[k]}
            problems.append(f"{pdir.name}: {len(lost)} keys lost, {len(extra)} resurrected, {len(other)} changed")
        start, end = brokers[pdir.name]
        offsets = [r.offset for r in broker_view(pdir)]
        if offsets and (min(offsets) < start or max(offsets) >= end):
            problems.append(f"{pdir.name}: offsets [{min(offsets)}, {max(offsets)}] outside [{start}, {end})")
    return problems


class Stage:
    """A live broker (lock held, logs open, a twin without sidecar getting the same writes)
    next to a stage-mode sidecar."""

    def __init__(self, tmp_path: Path, make_log_dir, **policy: object) -> None:
        self.data = make_log_dir(**GENERATED)
        self.twin = tmp_path / "twin"
        shutil.copytree(self.data, self.twin)
        self.lock = BrokerLock(self.data).acquire()
        self.brokers = [SimBroker(self.data, seed=5), SimBroker(self.twin, seed=5)]
        self.tps = sorted(self.brokers[0].logs, key=str)
        self.policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=COMPACT, **policy)
        self.sc = new_sidecar(self.policy, [self.data])

    def broker(self, op: str, tp: TopicPartition, *args: object, **kwargs: object) -> None:
        for b in self.brokers:
            getattr(b, op)(tp, *args, **kwargs)

    def offsets(self) -> dict[str, tuple[int, int]]:
        b = self.brokers[0]
        return {str(tp): (b.logs[tp].log_start_offset, b.log_end_offset(tp)) for tp in self.tps}

    def differences(self) -> list[str]:
        return _differences(self.data, self.twin, self.offsets())

    def check(self) -> dict:
        """The moment: the sidecar validates (a tick), then the broker would start."""
        doc = next_scan(self.sc)
        assert self.differences() == []
        unexpected = [
            e for e in doc["errors"] if not e["message"].startswith(("discarding staged set", "staging skipped"))
        ]
        assert unexpected == []
        for pdir in _partitions(self.data):
            s = stage.load_manifest(pdir)
            swaps = _swaps(pdir)
            assert swaps == (sorted(s.staged) if s is not None else []), "one complete set per partition at most"
        return doc

    def close(self) -> None:
        for b in self.brokers:
            b.close()
        self.lock.release()


def test_stage_survives_every_broker_move(tmp_path: Path, make_log_dir) -> None:
    t = Stage(tmp_path, make_log_dir)
    a, b = t.tps
    broker_files = {k: v for k, v in snapshot_dir(t.data).items() if k != ".lock"}

    # Staging: one partition per turn, never the broker's files.
    t.check()
    doc = t.check()
    sets = _sets(t.data)
    assert set(sets) == {str(a), str(b)}
    assert doc["cleaner"]["stagedBytes"] == sum(s.staged_bytes for s in sets.values()) > 0
    now = snapshot_dir(t.data)
    assert {k: now[k] for k in broker_files} == broker_files, "a broker file changed"
    assert not (t.data / CLEANER_OFFSET_CHECKPOINT).exists()
    assert all(n.endswith((".swap", stage.MANIFEST)) for n in set(now) - set(broker_files) - {".lock"})

    # A new segment rolls (and more data comes): the sets stay, still one per partition.
    for tp in t.tps:
        t.broker("append", tp, 40, tombstones=4)
        t.broker("roll", tp)
        t.broker("append", tp, 10)
    for _ in range(3):
        t.check()
    assert _sets(t.data) == sets

    # A policy change: the sets are still right.
    write_policy(t.policy, mode="stage", topics=[{**COMPACT[0], "minCleanableDirtyRatio": 0.9}], generation=2)
    assert t.check()["policyGeneration"] == 2
    assert _sets(t.data) == sets

    # A truncation into the staged range of `a`: without validation the broker's restart
    # would bring the truncated records back. The stale set is discarded (and the same turn
    # may stage a new one from the truncated log).
    truncated_at = sets[str(a)].next_offset - 50
    t.broker("truncate", a, truncated_at)
    t.broker("append", a, 20)
    assert t.differences() != [], "this moment is not dangerous: the test proves nothing"
    doc = t.check()
    assert any("discarding staged set" in e["message"] and e["partition"] == str(a) for e in doc["errors"])
    new = _sets(t.data).get(str(a))
    assert new is None or (new.created_at_ms > sets[str(a)].created_at_ms and new.next_offset <= truncated_at)
    t.check()

    # Retention deletes source segments of `b` (keys whose last value was there are gone).
    t.broker("retention", b, 2)
    assert t.differences() != [], "this moment is not dangerous: the test proves nothing"
    doc = t.check()
    assert any("discarding staged set" in e["message"] and e["partition"] == str(b) for e in doc["errors"])
    t.check()  # staged again, from the new log start
    new = _sets(t.data)[str(b)]
    assert new.base_offset == t.brokers[0].logs[b].log_start_offset and new.created_at_ms > sets[str(b)].created_at_ms

    # The policy stops matching the topic: its sets must not wait for the broker unvalidated.
    write_policy(t.policy, mode="stage", topics=[{"match": "other-.*", "cleanupPolicy": "compact"}], generation=3)
    t.check()
    assert _sets(t.data) == {}, "a set no policy validates any more must not stay for the broker"
    assert leftover_files(t.data) == []
    t.broker("retention", b, 1)
    t.check()
    t.close()


def test_leaving_stage_mode_discards_the_sets(tmp_path: Path, make_log_dir) -> None:
    """Only stage mode validates staged sets; when the policy switches to another mode the
    sets go (a set nobody validates may turn stale before the broker restarts)."""
    t = Stage(tmp_path, make_log_dir)
    t.check()
    t.check()
    assert len(_sets(t.data)) == 2
    write_policy(t.policy, mode="observe", topics=COMPACT, generation=2)
    doc = t.check()
    assert doc["mode"] == "observe"
    assert _sets(t.data) == {} and leftover_files(t.data) == []
    t.broker("retention", t.tps[0], 1)
    t.check()
    t.close()


def test_pause_keeps_validating(tmp_path: Path, make_log_dir) -> None:
    t = Stage(tmp_path, make_log_dir)
    t.check()
    t.check()
    write_policy(t.policy, mode="stage", topics=COMPACT, paused=True, generation=2)
    assert t.check()["cleaner"]["state"] == "paused"
    t.broker("retention", t.tps[0], 1)
    t.check()  # a paused sidecar still discards the stale set
    assert str(t.tps[0]) not in _sets(t.data)
    t.check()
    assert str(t.tps[0]) not in _sets(t.data), "paused, but staged again"
    t.close()


def test_never_stages_at_or_above_the_high_watermark_or_an_open_transaction(tmp_path: Path, make_log_dir) -> None:
    t = Stage(tmp_path, make_log_dir)
    a, b = t.tps
    for tp in t.tps:  # closed segments above where the broker will put the HW / LSO
        for _ in range(4):
            t.broker("append", tp, 30)
            t.broker("roll", tp)
    hw = t.brokers[0].logs[a].segments[-3].base_offset + 7
    t.broker("set_high_watermark", a, hw)
    lso = t.brokers[0].log_end_offset(b)
    t.broker("append", b, 5, is_transactional=True, producer_id=9_999, producer_epoch=0, base_sequence=0)
    for _ in range(3):
        t.broker("append", b, 30)
        t.broker("roll", b)
    t.check()
    t.check()
    sets = _sets(t.data)
    assert set(sets) == {str(a), str(b)}
    assert sets[str(a)].next_offset <= hw and sets[str(a)].high_watermark == hw
    assert sets[str(b)].next_offset <= lso
    for name, s in sets.items():
        last_source = max(int(f.name.split(".")[0]) for f in s.sources if f.name.endswith(".log"))
        limit = hw if name == str(a) else lso
        assert last_source < limit
    t.close()


def test_free_disk_ratio_stops_staging(tmp_path: Path, make_log_dir) -> None:
    t = Stage(tmp_path, make_log_dir, stage={"minFreeDiskRatio": 1.0})
    doc = t.check()
    doc = t.check()
    assert _sets(t.data) == {} and leftover_files(t.data) == []
    assert any("staging skipped: free disk would drop below 100%" in e["message"] for e in doc["errors"])
    assert doc["cleaner"]["state"] != "error"
    t.close()


def test_a_restarted_sidecar_finds_and_validates_its_sets(tmp_path: Path, make_log_dir) -> None:
    t = Stage(tmp_path, make_log_dir)
    t.check()
    t.check()
    sets = _sets(t.data)
    assert len(sets) == 2
    del t.sc  # killed: no stop(), no final validation

    t.sc = new_sidecar(t.policy, [t.data])
    doc = t.check()
    assert _sets(t.data) == sets, "a valid set was discarded (or restaged) after a restart"
    assert doc["cleaner"]["stagedBytes"] == sum(s.staged_bytes for s in sets.values())
    assert not any("discarding" in e["message"] for e in doc["errors"])

    # Down while the broker truncates: the next sidecar discards at once.
    a = t.tps[0]
    t.sc.stop()
    t.broker("truncate", a, sets[str(a)].next_offset - 10)
    t.sc = new_sidecar(t.policy, [t.data])
    t.sc.tick()
    doc = status_of(t.sc)
    assert any("discarding staged set" in e["message"] and e["partition"] == str(a) for e in doc["errors"]), doc
    new = _sets(t.data).get(str(a))
    assert new is None or new.next_offset <= sets[str(a)].next_offset - 10
    assert t.differences() == []
    t.close()


def _delete_first_segment(pdir: Path) -> None:
    """What the broker's retention leaves on disk: the oldest segment's files gone and the
    log start offset checkpointed at the next segment."""
    bases = sorted(int(p.name.split(".")[0]) for p in pdir.glob("*.log"))
    for p in pdir.iterdir():
        if p.name.split(".")[0].isdigit() and int(p.name.split(".")[0]) == bases[0] and ".swap" not in p.name:
            p.unlink()
    checkpoint = OffsetCheckpointFile(pdir.parent / LOG_START_OFFSET_CHECKPOINT)
    starts = checkpoint.read()
    starts[TopicPartition("topic-0", int(pdir.name.rsplit("-", 1)[1]))] = bases[1]
    checkpoint.write(starts)


def test_a_discard_interrupted_at_any_step_never_commits_part_of_a_set(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kill the sidecar (an I/O error) at every durable step of a discard: unless it died
    before the first step changed anything, a broker starting on what is left serves
    exactly its own log (no part of the set is committed); a restarted sidecar finishes
    the discard and leaves exactly the broker's files."""
    data = make_log_dir(**{**GENERATED, "partitions": 1, "records": 3_000, "segment_bytes": 48 * 1024})
    ref = tmp_path / "ref"  # the broker's own log after retention
    shutil.copytree(data, ref)
    policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=COMPACT)
    sc = new_sidecar(policy, [data])
    sc.tick()
    staged = tmp_path / "staged"
    shutil.copytree(data, staged)
    assert len(_sets(staged)) == 1
    # The restarted sidecars only validate (paused: no new staging in the same turn).
    paused = write_policy(tmp_path / "paused.yaml", mode="stage", topics=COMPACT, paused=True)
    _delete_first_segment(ref / "topic-0-0")
    end = OffsetCheckpointFile(ref / REPLICATION_OFFSET_CHECKPOINT).read()[TopicPartition("topic-0", 0)]
    offsets = {"topic-0-0": (min(int(p.name[:20]) for p in (ref / "topic-0-0").glob("*.log")), end)}
    broker_files = {n: v[0] for n, v in snapshot_dir(ref / "topic-0-0").items()}

    def attempt(at: int | None) -> StepFaults:
        work = tmp_path / f"work-{at}"
        shutil.copytree(staged, work)
        _delete_first_segment(work / "topic-0-0")
        if at is None:
            assert _differences(work, ref, offsets) != [], "the stale set is harmless: the test proves nothing"
        staged_files = {n: v for n, v in snapshot_dir(work / "topic-0-0").items() if n.endswith(".swap")}
        restarted = new_sidecar(paused, [work])
        faults = StepFaults(at, names=("rename", "write_file", "remove", "fsync_dir")).install(monkeypatch)
        restarted.tick()
        monkeypatch.undo()
        now = snapshot_dir(work / "topic-0-0")
        if at == 1 and all(now.get(n) == v for n, v in staged_files.items()):
            # Killed before the discard changed anything: the documented window between a
            # change and its discard (the whole stale set is there, nothing partial).
            assert stage.load_manifest(work / "topic-0-0") is not None
        else:
            assert _differences(work, ref, offsets) == [], f"interrupted at step {at}: {faults.log[:at]}"
        if at is not None:
            assert restarted.state.state == "error"
            new_sidecar(paused, [work]).tick()
        assert {n: v[0] for n, v in snapshot_dir(work / "topic-0-0").items()} == broker_files
        shutil.rmtree(work)
        return faults

    steps = attempt(None).calls
    assert steps >= 6
    for at in range(1, steps + 1):
        attempt(at)
