"""Reading next to a busy broker (issue 21, item 5): the files a running broker writes shrink,
grow, vanish and are renamed between any two reads of a scan. A short read is "the file
changed under us" (``FileChangedError``), never a ``struct.error``; one partition's failure
never drops another partition's status; and nothing that goes wrong in a scan or in a mode's
step ends the sidecar's loop (``run``): it is logged, counted in
``kafka_cleaner_scan_failures_total`` / ``kafka_cleaner_loop_errors_total``, reported in
``/status``, and the next scan runs."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sidecar_helpers import NOW_MS, SCAN_MS, SimBroker, new_sidecar, next_scan, status_of, write_policy

import cleaner.cleaning
import cleaner.replica_facts as replica_facts_module
import cleaner.sidecar.service as service_module
from cleaner.clock import MockTime
from cleaner.errors import KafkaCleanerError
from cleaner.segment_facts import scan_segment as real_scan_segment
from cleaner.sidecar.service import Sidecar
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.topic_partition import TopicPartition

MakeLogDir = Callable[..., Path]
PREALLOCATED = 1024 * 1024
"""An active offset index as a live broker has it: preallocated (10 MiB by default; 1 MiB
here), only its head holding entries, the rest zeros until the roll trims it."""


def _sample(sc: Sidecar, name: str, **labels: str) -> float:
    return sc.metrics.registry.get_sample_value(name, labels) or 0.0


def _partitions(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{p['topic']}-{p['partition']}": p for p in doc["partitions"]}


def _picture(sc: Sidecar) -> dict[str, tuple[Any, ...]]:
    """Every partition of the last scan: offsets, sizes and record facts."""
    assert sc.snapshot is not None
    return {
        str(s.report.topic_partition): (
            s.report.log_start_offset,
            s.report.log_end_offset,
            s.report.size_bytes,
            s.report.cleanable_bytes,
            s.report.reason,
            s.facts,
        )
        for s in sc.snapshot.statuses
    }


def _scan(sc: Sidecar) -> dict[str, tuple[Any, ...]]:
    next_scan(sc)
    return _picture(sc)


def _replicas(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{e['topic']}-{e['partition']}": e for e in doc["replicas"]["partitions"]}


def _active_index(partition_dir: Path) -> Path:
    return sorted(partition_dir.glob("*.index"))[-1]


def _preallocate(index: Path) -> int:
    """Pad the index with zeros as Kafka's mmap of a new active segment does; returns the
    valid size (what the roll's ``trimToValidSize`` cuts it back to)."""
    valid = index.stat().st_size
    os.truncate(index, PREALLOCATED)
    return valid


class _OsWithHook:
    """``os`` for one module, with ``pread`` replaced (everything else is the real ``os``)."""

    def __init__(self, pread: Callable[[int, int, int], bytes]) -> None:
        self.pread = pread

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def _trim_at_first_pread(monkeypatch: pytest.MonkeyPatch, index: Path, valid: int) -> list[int]:
    """Kafka rolls the segment between the reader's ``fstat`` and its first ``pread`` of
    ``index``: the preallocated file is trimmed to its valid size at that instant."""
    calls: list[int] = []

    def pread(fd: int, n: int, position: int) -> bytes:
        if not calls and os.readlink(f"/proc/self/fd/{fd}") == str(index):
            calls.append(position)
            os.truncate(index, valid)
        return os.pread(fd, n, position)

    monkeypatch.setattr(replica_facts_module, "os", _OsWithHook(pread))
    return calls


# -- (a) an index trimmed between fstat and pread ------------------------------------------------


def test_an_index_trimmed_between_fstat_and_pread_is_a_typed_error(
    make_log_dir: MakeLogDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make_log_dir()
    index = max((data / "topic-0-0").glob("*.index"), key=lambda p: p.stat().st_size)
    base = int(index.name.split(".")[0])
    before = replica_facts_module._index_floor(index, base, base + 10**9)
    valid = _preallocate(index)
    assert before > 0 and replica_facts_module._index_floor(index, base, base + 10**9) == before
    calls = _trim_at_first_pread(monkeypatch, index, valid)
    with pytest.raises(KafkaCleanerError) as raised:
        replica_facts_module._index_floor(index, base, base + 10**9)
    assert calls, "the hook never ran: the index was not read"
    assert type(raised.value).__name__ == "FileChangedError"
    assert str(index) in str(raised.value) and "changed" in str(raised.value)
    # Read again afterwards (the trimmed file): the same answer as before.
    assert replica_facts_module._index_floor(index, base, base + 10**9) == before


def test_a_scan_meeting_a_trimmed_index_keeps_every_partition(
    tmp_path: Path, make_log_dir: MakeLogDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old code: ``struct.error: unpack requires a buffer of 8 bytes`` escaped ``scan()`` and
    ``tick()`` (and ended ``run()``'s loop)."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    index = _active_index(data / "topic-0-0")
    valid = _preallocate(index)
    expected = _scan(new_sidecar(policy, [data]))
    sc = new_sidecar(policy, [data])
    calls = _trim_at_first_pread(monkeypatch, index, valid)
    doc = next_scan(sc)
    assert calls, "the hook never ran: the probe did not read the index"
    assert _picture(sc) == expected
    replicas = _replicas(doc)
    assert replicas["topic-0-0"]["batches"] == [], "no probe from an index that changed under the read"
    assert all(e["batches"] for name, e in replicas.items() if name != "topic-0-0")
    assert _sample(sc, "kafka_cleaner_scan_failures_total", reason="file_changed") == 1
    # The next scan reads the trimmed index as it now is: probes again.
    monkeypatch.undo()
    assert _replicas(next_scan(sc))["topic-0-0"]["batches"]


# -- (b) one partition's files vanish mid-scan ---------------------------------------------------


def _delete_topic_partition(partition_dir: Path) -> Path:
    """Kafka's topic deletion: the dir is renamed to ``<name>.<uuid>-delete`` at once."""
    gone = partition_dir.with_name(f"{partition_dir.name}.{uuid.uuid4().hex}-delete")
    os.rename(partition_dir, gone)
    return gone


@pytest.mark.parametrize("when", ["opening", "reading facts", "reading the probe", "unexpected error"])
def test_one_partition_failing_mid_scan_keeps_every_other_status(
    tmp_path: Path, make_log_dir: MakeLogDir, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """One partition is deleted (renamed to ``-delete``) at one moment of a scan, or one
    partition's reader raises a bug's exception. Old code: the deletion between the dir
    listing and the log's opening emptied the whole scan ("scan failed", no partition left);
    the ValueError escaped ``tick()``."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    expected = _scan(new_sidecar(policy, [data]))
    victim = TopicPartition("topic-1", 0)
    victim_dir = data / victim.dir_name
    sc = new_sidecar(policy, [data])
    fired: list[str] = []

    if when == "opening":  # between the dir listing and the log's opening
        real_open = LogDirectory.open_log

        def open_log(self: LogDirectory, tp: TopicPartition, *args: Any, **kwargs: Any) -> Any:
            if tp == victim and not fired:
                fired.append(str(_delete_topic_partition(victim_dir)))
            return real_open(self, tp, *args, **kwargs)

        monkeypatch.setattr(LogDirectory, "open_log", open_log)
    elif when in ("reading facts", "unexpected error"):

        def scan_segment(segment: Any, *args: Any, **kwargs: Any) -> Any:
            if segment.log_path.parent.name == victim.dir_name and not fired:
                if when == "unexpected error":
                    fired.append("ValueError")
                    raise ValueError("a bug in a reader")
                fired.append(str(_delete_topic_partition(victim_dir)))
            return real_scan_segment(segment, *args, **kwargs)

        monkeypatch.setattr("cleaner.segment_facts.scan_segment", scan_segment)
    else:
        real_batch_at = replica_facts_module._batch_at

        def batch_at(partition_log: Any, offset: int) -> Any:
            if partition_log.dir.name == victim.dir_name and not fired:
                fired.append(str(_delete_topic_partition(victim_dir)))
            return real_batch_at(partition_log, offset)

        monkeypatch.setattr(replica_facts_module, "_batch_at", batch_at)
    doc = next_scan(sc)
    assert fired, f"the fault was never injected ({when})"
    got = _picture(sc)
    others = {name: picture for name, picture in expected.items() if name != str(victim)}
    assert {name: got.get(name) for name in others} == others, f"{when}; errors: {doc['errors']}"
    if when == "unexpected error":
        # Its own status says what failed (seen for the first time: reported at once), and
        # the failure is counted as a bug's.
        entry = _partitions(doc)[str(victim)]
        assert entry["reason"] == "uncleanable" and "a bug in a reader" in entry["uncleanableReason"]
        assert any("a bug in a reader" in e["message"] and e["partition"] == str(victim) for e in doc["errors"])
        assert _sample(sc, "kafka_cleaner_scan_failures_total", reason="unexpected") == 1
    # The next scan sees the partition as it now is: gone, or back to its full picture.
    monkeypatch.undo()
    next_scan(sc)
    if when == "unexpected error":
        assert _picture(sc) == expected
    else:
        assert _picture(sc) == others


def test_a_segment_deleted_before_the_next_clean_estimate_is_looked_at_again(
    tmp_path: Path, make_log_dir: MakeLogDir, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention or a topic deletion removes a segment between the scan's listing and the
    estimate of the next clean, which reads each segment's mtime. Old code: a raw
    ``FileNotFoundError`` from ``last_modified_ms``, logged as a WARNING "cannot estimate the
    next clean" (the soak's finding "uncleanable: ENOENT (raw errno)"); now a file that
    changed, looked at again at the next scan."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    sc = new_sidecar(policy, [data])
    pdir = data / "topic-0-0"
    real_shape = cleaner.cleaning.section_shape
    removed: list[str] = []

    def shape_after_retention(the_log: Any, first_dirty: int, first_uncleanable: int) -> tuple:
        if the_log.dir == pdir and not removed:
            first = min(pdir.glob("*.log"))
            first.unlink()  # the broker's ``.deleted`` rename, then its delete
            removed.append(first.name)
        return real_shape(the_log, first_dirty, first_uncleanable)

    monkeypatch.setattr(cleaner.cleaning, "section_shape", shape_after_retention)
    with caplog.at_level("INFO"):
        doc = next_scan(sc)
    assert removed, "the hook never ran: no estimate was made for topic-0-0"
    warnings = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert not warnings, warnings
    assert _partitions(doc)["topic-0-1"]["nextClean"] is not None, "another partition lost its estimate"
    # The next scan sees the log without that segment and estimates again.
    assert _partitions(next_scan(sc))["topic-0-0"]["nextClean"] is not None


def _write_in_progress(partition_dir: Path, nbytes: int) -> Path:
    """The broker appending a batch to the active segment, seen mid-copy: a ``write`` that
    crosses a page boundary moves the file's size page by page, so a reader's ``fstat``
    can count the first bytes of a batch whose rest is not there yet (the soak saw
    ``byte 24575: truncated batch: 1 bytes left``, 24,576 being a page boundary)."""
    active = max(partition_dir.glob("*.log"))
    head = active.read_bytes()[: max(nbytes, 1)]
    with active.open("ab") as f:
        f.write(head[:nbytes])
    return active


@pytest.mark.parametrize("nbytes", [1, 11, 61, 200])
@pytest.mark.parametrize("mode", ["observe", "stage"])
def test_a_batch_being_written_to_the_active_segment_is_not_corruption(
    tmp_path: Path, make_log_dir: MakeLogDir, caplog: pytest.LogCaptureFixture, nbytes: int, mode: str
) -> None:
    """The first bytes of a batch at the end of a live broker's active segment are a write in
    progress, as Kafka's readers (bounded by the log end offset) treat them. Old code: the
    producer state's replay read the active segment to its size and raised
    ``CorruptRecordError: truncated batch``, a WARNING and the partition's scan lost (the
    600 s soak on 4.3.1, in stage mode). Every other reader already stopped there."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode=mode)
    expected = _scan(new_sidecar(policy, [data]))
    sc = new_sidecar(policy, [data])
    _write_in_progress(data / "topic-0-0", nbytes)
    with caplog.at_level("INFO"):
        doc = next_scan(sc)
    warnings = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert not warnings, warnings
    assert _picture(sc)["topic-0-0"][:2] == expected["topic-0-0"][:2]  # log start and end offsets
    assert _partitions(doc)["topic-0-0"]["reason"] != "uncleanable"
    assert _sample(sc, "kafka_cleaner_scan_failures_total", reason="corrupt") == 0


# -- (c) the real loop survives -------------------------------------------------------------------


class _LoopClock(MockTime):
    """A MockTime whose ``wait`` moves itself forward (the loop's turns take no real time)
    and stops the loop after ``max_waits`` turns or when ``until()`` holds, whichever first."""

    def __init__(self, max_waits: int) -> None:
        super().__init__(NOW_MS)
        self.waits: list[float] = []
        self.max_waits = max_waits
        self.until: Callable[[], bool] = lambda: False

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        self.waits.append(timeout_ms)
        self.advance(timeout_ms)
        if len(self.waits) >= self.max_waits or self.until():
            event.set()
        return event.is_set()


def test_the_loop_survives_a_failing_scan_a_failing_step_and_a_failing_turn(
    tmp_path: Path, make_log_dir: MakeLogDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run()`` of the real service: one scan raises a bug's exception, one mode step does,
    and two turns fail outside both (the log-dir expansion). Old code: the scan's
    RuntimeError ended ``run()`` (and with it the sidecar's loop; /healthz 503)."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    clock = _LoopClock(max_waits=40)
    sc = new_sidecar(policy, [data], clock)
    scans: list[int] = []
    real_status = cleaner.cleaning.status

    def status(*args: Any, **kwargs: Any) -> Any:
        scans.append(clock.milliseconds())
        if len(scans) == 2:
            raise RuntimeError("injected: a bug in the scan")
        return real_status(*args, **kwargs)

    monkeypatch.setattr(cleaner.cleaning, "status", status)
    steps: list[int] = []
    real_step = service_module._Controller.step

    def step(self: Any, now: int) -> None:
        steps.append(now)
        if len(steps) == 3:
            raise RuntimeError("injected: a bug in the mode's step")
        real_step(self, now)

    monkeypatch.setattr(service_module._Controller, "step", step)
    expansions: list[int] = []
    real_expand = service_module.expand_log_dirs

    def expand(patterns: list[str]) -> Any:
        expansions.append(clock.milliseconds())
        if len(expansions) in (5, 6):
            raise RuntimeError("injected: a bug elsewhere in the turn")
        return real_expand(patterns)

    monkeypatch.setattr(service_module, "expand_log_dirs", expand)
    clock.until = lambda: len(scans) >= 6
    sc.run(tick_ms=SCAN_MS)

    assert len(scans) >= 6, f"the loop stopped after {len(scans)} scans ({len(clock.waits)} turns)"
    assert sc.healthy()
    assert _sample(sc, "kafka_cleaner_loop_errors_total", step="scan") == 1
    assert _sample(sc, "kafka_cleaner_loop_errors_total", step="mode") == 1
    assert _sample(sc, "kafka_cleaner_loop_errors_total", step="turn") == 2
    doc = status_of(sc)
    messages = [e["message"] for e in doc["errors"]]
    for what in ("a bug in the scan", "a bug in the mode's step", "a bug elsewhere in the turn"):
        assert any(what in m for m in messages), (what, messages)
    # The scans after the failures are whole again.
    assert len(doc["partitions"]) == 4
    # A failed turn backs off on the clock, boundedly, and the back-off ends with a turn
    # that works: the turns are SCAN_MS apart again.
    assert max(clock.waits) <= service_module.MAX_LOOP_BACKOFF_MS
    assert any(w > SCAN_MS for w in clock.waits)
    assert clock.waits[-1] == SCAN_MS


def test_a_failing_turn_backs_off_boundedly(tmp_path: Path, make_log_dir: MakeLogDir, monkeypatch) -> None:
    """Every turn failing (a bug that does not go away): the loop keeps turning, each wait
    at most MAX_LOOP_BACKOFF_MS of the clock, never a busy loop nor a real sleep."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    clock = _LoopClock(max_waits=30)
    sc = new_sidecar(policy, [data], clock)

    def expand(patterns: list[str]) -> Any:
        raise RuntimeError("injected: always")

    monkeypatch.setattr(service_module, "expand_log_dirs", expand)
    started = time.monotonic()
    sc.run(tick_ms=1_000)
    assert time.monotonic() - started < 30, "the loop slept for real"
    assert len(clock.waits) == 30 and sc.healthy()
    assert clock.waits[0] > 1_000, "a failed turn waits longer than a turn"
    assert clock.waits == sorted(clock.waits), "the back-off only grows while the turns fail"
    assert clock.waits[-1] == service_module.MAX_LOOP_BACKOFF_MS
    assert _sample(sc, "kafka_cleaner_loop_errors_total", step="turn") == 30
    assert len([e for e in status_of(sc)["errors"] if "injected: always" in e["message"]]) == 1


# -- (d) a broker that rolls, trims, renames and deletes while scans run -----------------------


class _Chaos:
    """Plays a busy broker next to the scans: appends, rolls (the preallocated active index
    trimmed, as Kafka's roll does), retention, truncation, checkpoints replaced and producer
    snapshots rewritten in place, a topic deletion (rename to ``-delete``, then removal), a
    reassignment's ``-future`` copy: a fixed number of operations, so it ends."""

    def __init__(self, data: Path, seed: int, ops: int) -> None:
        self.data = data
        self.broker = SimBroker(data, seed=seed)
        self.rng = random.Random(seed)
        self.ops = ops
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.applied: list[str] = []

    def run(self) -> None:
        try:
            for _ in range(self.ops):
                self.applied.append(self.step())
        except BaseException as e:  # the test reports it
            self.error = e
        finally:
            self.done.set()

    def step(self) -> str:
        b, rng = self.broker, self.rng
        tps = sorted(b.logs, key=str)
        if not tps:
            return "nothing left"
        tp = rng.choice(tps)
        pdir = b.partition_dir(tp)
        op = rng.choice(["append"] * 6 + ["roll", "roll", "retention", "truncate", "rewrite", "delete", "future"])
        if op == "append":
            b.append(tp, rng.randint(1, 30), tombstones=rng.randint(0, 3))
        elif op == "roll" and b.logs[tp].active_segment.size > 0:  # Kafka never rolls an empty one
            # The roll writes the old active index trimmed (Kafka's trimToValidSize: from
            # PREALLOCATED bytes to its entries); the new one starts preallocated.
            with b.lock:
                new = b.logs[tp].roll()
                with open(new.index_path, "ab"):
                    os.truncate(new.index_path, PREALLOCATED)
        elif op == "retention":
            if len(b.logs[tp].segments) > 2:
                b.retention(tp, 1)
        elif op == "truncate":
            # Within the active segment (a follower's truncation after a leader change).
            leo, active = b.log_end_offset(tp), b.logs[tp].active_segment
            if active is not None and leo - active.base_offset > 1:
                b.truncate(tp, leo - rng.randint(1, leo - active.base_offset - 1))
        elif op == "rewrite":
            # Checkpoints and partition.metadata are replaced by a rename (a reader that
            # opens twice sees two files); a producer snapshot is written in place, so a
            # reader may see it half written.
            with b.lock:
                for target in [self.data / "replication-offset-checkpoint", pdir / "partition.metadata"]:
                    if target.exists():
                        tmp = target.with_name(target.name + ".tmp")
                        tmp.write_bytes(target.read_bytes())
                        os.replace(tmp, target)
                for snap in pdir.glob("*.snapshot"):
                    blob = snap.read_bytes()
                    snap.write_bytes(blob[: len(blob) // 2])
                    snap.write_bytes(blob)
        elif op == "delete":
            if len(tps) > 2:
                with b.lock:
                    b.logs.pop(tp).close()
                    gone = _delete_topic_partition(pdir)
                    b._checkpoint()
                shutil.rmtree(gone)
        elif op == "future":  # a reassignment between log dirs: a -future copy comes and goes
            future = pdir.with_name(f"{pdir.name}.{uuid.uuid4().hex}-future")
            with b.lock:
                shutil.copytree(pdir, future)
            shutil.rmtree(future)
        return op


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_scans_next_to_a_chaotic_broker_never_fail(tmp_path: Path, make_log_dir: MakeLogDir, seed: int) -> None:
    data = make_log_dir(topics=3, partitions=2, records=1_500)
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    sc = new_sidecar(policy, [data])
    next_scan(sc)
    chaos = _Chaos(data, seed, ops=150)
    thread = threading.Thread(target=chaos.run, name="chaos", daemon=True)
    scans = 0
    escaped: list[BaseException] = []
    thread.start()
    deadline = time.monotonic() + 120
    while (not chaos.done.is_set() or scans < 10) and scans < 2_000:
        assert time.monotonic() < deadline, f"the chaos did not finish ({len(chaos.applied)} operations done)"
        try:
            doc = next_scan(sc)
        except BaseException as e:  # what the test is about
            escaped.append(e)
            break
        scans += 1
        whole = [e["message"] for e in doc["errors"] if e["partition"] is None and e["logDir"] is None]
        assert not whole, f"scan {scans} failed as a whole: {whole}"
        assert len(doc["partitions"]) >= 2, f"scan {scans} lost partitions: {doc['errors']}"
    thread.join(60)
    assert not thread.is_alive(), "the chaos thread did not end"
    assert chaos.error is None, f"the simulated broker itself failed: {chaos.error!r}"
    assert not escaped, f"a scan raised after {scans} scans: {escaped[0]!r}"
    assert _sample(sc, "kafka_cleaner_scan_failures_total", reason="unexpected") == 0, status_of(sc)["errors"]
    for step in ("scan", "mode", "turn"):
        assert _sample(sc, "kafka_cleaner_loop_errors_total", step=step) == 0, (step, status_of(sc)["errors"])
    # Once the broker is quiet, a scan sees exactly what is there.
    next_scan(sc)
    picture = _scan(sc)
    assert set(picture) == {str(tp) for tp in chaos.broker.logs}
    for tp, log in chaos.broker.logs.items():
        assert picture[str(tp)][1] == log.log_end_offset, tp
