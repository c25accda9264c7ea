"""The cleaner under concurrency (issue 3, "Concurrency"; KAFKA_NOTES §6.6, §6.7): real
cleaner threads, driven by a ``MockTime`` (their backoff ends only when a test moves the
clock) and by gates on the threads' ``check_done`` (called before every read chunk), so
that "while a clean is in progress" is a state the test holds, not a timing it hopes for.

- abort/pause/resume from other threads, with the blocking semantics of §6.6;
- a truncation during a clean (the generation check aborts the swap; nothing is lost);
- ``LogCleaner.shutdown`` during a clean;
- a thread that dies of an unexpected error, detected and restarted;
- one corrupt partition marked uncleanable with its reason while the others are cleaned.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka_logs import (
    GENERATED_START_MS,
    broker_view,
    consumer_view,
    generate_partition,
    leftover_files,
    snapshot_dir,
    write_high_watermarks,
)

from cleaner.clock import MockTime
from cleaner.config import Policy, parse_policy_text
from cleaner.engine.log_cleaner import CleanerThread, LogCleaner
from cleaner.engine.manager import LogCleanerManager
from cleaner.errors import LogCleaningAbortedError
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.topic_partition import TopicPartition

CLI = Path(sys.executable).with_name("kafka-cleaner")
NOW_MS = GENERATED_START_MS + 3_600_000
BACKOFF_MS = 1_000
SEGMENT_BYTES = 8_192
CONFIG = LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=1024)
WAIT = 30.0
"""Upper bound, in real seconds, for something that takes milliseconds: only reached when
the code under test is stuck."""


def _policy(*, threads: int = 2, extra: str = "") -> Policy:
    return parse_policy_text(
        "mode: compact\n"
        "topics:\n"
        '  - match: ".*"\n'
        "    cleanupPolicy: compact\n"
        f"    segmentBytes: {SEGMENT_BYTES}\n"
        "    indexIntervalBytes: 1024\n"
        "cleaner:\n"
        f"  threads: {threads}\n"
        "  dedupeBufferSize: 4194304\n"
        f"  backoffMs: {BACKOFF_MS}\n"
        f"{extra}"
    )


def _log_dir(root: Path, topics: tuple[str, ...] = ("a", "b"), records: int = 2_000) -> dict[TopicPartition, int]:
    """Partitions of ~8 KiB segments, each a few dozen segments long; returns their
    log end offsets (also written as their high watermarks)."""
    root.mkdir(parents=True, exist_ok=True)
    ends = {}
    for i, topic in enumerate(topics):
        tp = TopicPartition(topic, 0)
        ends[tp] = generate_partition(root / tp.dir_name, seed=i, records=records, keys=200, config=CONFIG)
    write_high_watermarks(root, ends)
    return ends


def _checkpoints(root: Path) -> dict[TopicPartition, int]:
    return OffsetCheckpointFile(root / CLEANER_OFFSET_CHECKPOINT).read()


def _active_base(directory: Path) -> int:
    """Where a complete clean of a never-cleaned partition ends: its active segment."""
    log = Log.open(directory, CONFIG, read_only=True)
    assert log.active_segment is not None
    return log.active_segment.base_offset


def _eventually(condition: Callable[[], bool], clock: MockTime | None = None, what: str = "") -> None:
    """Poll ``condition`` (real time, short polls); move the mock clock past the backoff
    each time so that idle cleaner threads look again."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        if clock is not None:
            clock.advance(BACKOFF_MS + 1)
        time.sleep(0.01)


class Gate:
    """Holds a cleaner thread inside ``check_done`` for ``tp`` once ``when()`` is true, until
    ``release`` is set or the thread is told to shut down. Installed on the class before
    the pool starts (each ``Cleaner`` binds its thread's ``check_done`` when created)."""

    def __init__(self, tp: TopicPartition, when: Callable[[], bool] = lambda: True, *, times: int = 1) -> None:
        self.tp = tp
        self.when = when
        self.times = times
        self.reached = threading.Event()
        self.release = threading.Event()
        self.holder: CleanerThread | None = None
        self.on_hold: Callable[[], None] | None = None
        """Run by the held cleaner thread when it reaches the gate (a test's concurrent action)."""

    def install(self, monkeypatch: pytest.MonkeyPatch) -> Gate:
        real = CleanerThread.check_done
        gate = self

        def check_done(thread: CleanerThread, tp: TopicPartition) -> None:
            if tp == gate.tp and gate.times > 0 and gate.when():
                gate.times -= 1
                gate.holder = thread
                gate.reached.set()
                if gate.on_hold is not None:
                    gate.on_hold()
                deadline = time.monotonic() + WAIT
                while not gate.release.wait(0.005) and not thread._shutdown.is_set():
                    if time.monotonic() > deadline:
                        break
            real(thread, tp)

        monkeypatch.setattr(CleanerThread, "check_done", check_done)
        return self


def _count_cleans(monkeypatch: pytest.MonkeyPatch) -> dict[TopicPartition, int]:
    """How many cleans of each partition have started (``CleanerThread.clean_log`` calls)."""
    started: dict[TopicPartition, int] = {}
    real = CleanerThread.clean_log

    def clean_log(thread: CleanerThread, ltc, managed) -> None:
        started[ltc.topic_partition] = started.get(ltc.topic_partition, 0) + 1
        real(thread, ltc, managed)

    monkeypatch.setattr(CleanerThread, "clean_log", clean_log)
    return started


def _rewriting(directory: Path) -> Callable[[], bool]:
    """True once the clean of ``directory`` is writing a ``.cleaned`` segment."""
    return lambda: any(n.endswith(".cleaned") for n in os.listdir(directory))


def _start(root: Path, clock: MockTime, policy: Policy) -> tuple[LogCleanerManager, LogCleaner]:
    manager = LogCleanerManager([LogDirectory(root)], policy, clock)
    pool = LogCleaner(manager, policy.cleaner, clock)
    pool.start()
    return manager, pool


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, threading.Event, dict]:
    done, box = threading.Event(), {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # reported to the test
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done, box


# -- abort / pause / resume (§6.6) --------------------------------------------------------------


def test_state_transitions_and_illegal_states_of_the_manager_api(tmp_path: Path) -> None:
    """§6.6's table, single-threaded: absent -> Paused(1) -> Paused(2) -> Paused(1) -> absent;
    resuming what is not paused and finishing what is not in progress are IllegalState."""
    _log_dir(tmp_path, topics=("a",), records=300)
    tp = TopicPartition("a", 0)
    manager = LogCleanerManager([LogDirectory(tmp_path)], _policy(), MockTime(NOW_MS))
    with pytest.raises(RuntimeError):
        manager.resume_cleaning([tp])
    with pytest.raises(RuntimeError):
        manager.done_cleaning(tp, LogDirectory(tmp_path), 0)
    manager.abort_and_pause_cleaning(tp)  # idle: paused at once, no waiting
    assert manager.state(tp) == "LogCleaningPaused(1)"
    assert manager.grab_filthiest_compacted_log(NOW_MS) is None  # a paused log is never chosen
    manager.abort_and_pause_cleaning(tp)
    assert manager.state(tp) == "LogCleaningPaused(2)"
    with pytest.raises(RuntimeError):
        manager.done_cleaning(tp, LogDirectory(tmp_path), 0)
    manager.resume_cleaning([tp])
    assert manager.state(tp) == "LogCleaningPaused(1)"
    manager.resume_cleaning([tp])
    assert manager.state(tp) is None
    with pytest.raises(RuntimeError):
        manager.resume_cleaning([tp])
    ltc = manager.grab_filthiest_compacted_log(NOW_MS)
    assert ltc is not None and ltc.topic_partition == tp
    assert manager.state(tp) == "LogCleaningInProgress"
    with pytest.raises(RuntimeError):
        manager.resume_cleaning([tp])  # in progress is not paused
    manager.check_cleaning_aborted(tp)  # not aborted: no error
    manager.done_cleaning(tp, LogDirectory(tmp_path), 5)
    assert manager.state(tp) is None and _checkpoints(tmp_path) == {tp: 5}


def test_abort_and_pause_blocks_until_the_clean_has_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ends = _log_dir(tmp_path)
    a, b = TopicPartition("a", 0), TopicPartition("b", 0)
    before = {tp: broker_view(tmp_path / tp.dir_name, CONFIG) for tp in ends}
    keys_before = {tp: consumer_view(tmp_path / tp.dir_name, CONFIG).live for tp in ends}
    clean_end = {tp: _active_base(tmp_path / tp.dir_name) for tp in ends}
    gate = Gate(a, _rewriting(tmp_path / a.dir_name)).install(monkeypatch)
    clock = MockTime(NOW_MS)
    manager, pool = _start(tmp_path, clock, _policy(threads=2))
    try:
        assert gate.reached.wait(WAIT)
        assert manager.state(a) == "LogCleaningInProgress"
        _, paused, box = _in_thread(lambda: manager.abort_and_pause_cleaning(a))
        _eventually(lambda: manager.state(a) == "LogCleaningAborted", what="the abort request")
        # The cleaner thread is still inside its clean (held at the gate): the call waits.
        assert not paused.wait(0.3)
        # Aborted is not a state one may abort again, nor resume.
        with pytest.raises(RuntimeError):
            manager.abort_and_pause_cleaning(a)
        with pytest.raises(RuntimeError):
            manager.resume_cleaning([a])
        gate.release.set()
        assert paused.wait(WAIT) and "error" not in box
        # Returned only once the clean had stopped: its temporary files are gone already.
        assert manager.state(a) == "LogCleaningPaused(1)"
        assert leftover_files(tmp_path / a.dir_name) == []
        assert a not in _checkpoints(tmp_path) or _checkpoints(tmp_path)[a] == 0
        assert broker_view(tmp_path / a.dir_name, CONFIG) == before[a]
        # The other thread cleans b meanwhile; a stays paused however often threads look.
        _eventually(lambda: _checkpoints(tmp_path).get(b) == clean_end[b], clock, "b cleaned")
        # await_cleaned (Kafka's test hook) gives up once its time, on the pool's clock, is out.
        _, gave_up, result = _in_thread(lambda: pool.await_cleaned(a, clean_end[a], 5 * BACKOFF_MS))
        _eventually(gave_up.is_set, clock, "await_cleaned to time out")
        assert result.get("result") is False
        assert manager.state(a) == "LogCleaningPaused(1)"
        assert broker_view(tmp_path / a.dir_name, CONFIG) == before[a]
        # Pauses nest; only the last resume makes the partition cleanable again.
        manager.abort_and_pause_cleaning(a)
        assert manager.state(a) == "LogCleaningPaused(2)"
        manager.resume_cleaning([a])
        assert manager.state(a) == "LogCleaningPaused(1)"
        manager.resume_cleaning([a])
        assert manager.state(a) is None
        # (The test moves the mock clock fast to end backoffs: a timeout that cannot expire.)
        _, reached, result = _in_thread(lambda: pool.await_cleaned(a, clean_end[a], 10**15))
        _eventually(reached.is_set, clock, "a cleaned after the resume")
        assert result.get("result") is True
    finally:
        gate.release.set()
        pool.shutdown()
    for tp in ends:
        assert consumer_view(tmp_path / tp.dir_name, CONFIG).live == keys_before[tp]
    assert leftover_files(tmp_path) == []


def test_abort_cleaning_stops_the_clean_and_leaves_the_partition_cleanable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _log_dir(tmp_path, topics=("a",))
    a = TopicPartition("a", 0)
    original = tmp_path / "original"
    shutil.copytree(tmp_path / a.dir_name, original / a.dir_name)
    end = _active_base(tmp_path / a.dir_name)
    rewriting = _rewriting(tmp_path / a.dir_name)
    gate = Gate(a, rewriting).install(monkeypatch)
    # The next clean of the partition is held at its first check, before it writes anything.
    started = _count_cleans(monkeypatch)
    again = Gate(a, lambda: started.get(a, 0) >= 2).install(monkeypatch)
    clock = MockTime(NOW_MS)
    manager, pool = _start(tmp_path, clock, _policy(threads=1))
    try:
        assert gate.reached.wait(WAIT)
        _, aborted, box = _in_thread(lambda: manager.abort_cleaning(a))
        _eventually(lambda: manager.state(a) == "LogCleaningAborted", what="the abort request")
        assert not aborted.wait(0.2)
        gate.release.set()
        assert aborted.wait(WAIT) and "error" not in box
        # abort = abort and pause, then resume: the partition is chosen again (Kafka's
        # cleaner thread goes on without backoff after an aborted clean).
        _eventually(again.reached.is_set, clock, "the partition to be chosen again")
        assert manager.state(a) == "LogCleaningInProgress"
        assert leftover_files(tmp_path / a.dir_name) == []
        assert _checkpoints(tmp_path).get(a, 0) == 0
        again.release.set()
        _eventually(lambda: _checkpoints(tmp_path).get(a) == end, clock, "the clean after the abort")
    finally:
        gate.release.set()
        again.release.set()
        pool.shutdown()
    assert consumer_view(tmp_path / a.dir_name, CONFIG).live == consumer_view(original / a.dir_name, CONFIG).live


# -- truncation during a clean ----------------------------------------------------------------


def _truncated_copy(source: Path, target: Path, offset: int) -> Path:
    shutil.copytree(source, target)
    log = Log.open(target, CONFIG)
    log.truncate_to(offset)
    log.close()
    return target


def _segment_bases(directory: Path) -> list[int]:
    return [s.base_offset for s in Log.open(directory, CONFIG, read_only=True).segments]


@pytest.mark.parametrize(
    "phase",
    [
        "rewrite",
        pytest.param(
            "map",
        ),
    ],
)
def test_a_truncation_during_a_clean_aborts_it_and_a_later_clean_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    """A follower truncating while the cleaner works (no pause first, unlike Kafka's
    LogManager): the clean must abort (the swap's generation check), nothing of the kept
    offsets may be lost, and the next clean cleans the truncated log.

    "rewrite": held while the first group is rewritten, the truncation cuts the log's last
    segments. "map": held at the start of the offset map, the truncation removes the
    second half of the segments, which the map has yet to read."""
    root = tmp_path / "dir"
    _log_dir(root, topics=("a",))
    a = TopicPartition("a", 0)
    bases = _segment_bases(root / a.dir_name)
    assert len(bases) >= 10
    offset = (bases[-3] if phase == "rewrite" else bases[len(bases) // 2]) + 3
    expected = consumer_view(_truncated_copy(root / a.dir_name, tmp_path / "expected" / a.dir_name, offset), CONFIG)
    clock = MockTime(NOW_MS)
    manager = LogCleanerManager([LogDirectory(root)], _policy(threads=1), clock)
    the_log = manager.logs()[a].log
    rewriting = _rewriting(root / a.dir_name)
    gate = Gate(a, rewriting if phase == "rewrite" else lambda: not rewriting()).install(monkeypatch)
    truncated = threading.Event()

    def truncate() -> None:  # another thread: the "replica fetcher"
        the_log.truncate_to(offset)
        truncated.set()
        gate.release.set()

    gate.on_hold = lambda: threading.Thread(target=truncate).start()
    # The next clean is held at its first check: the state between the two can be looked at.
    started = _count_cleans(monkeypatch)
    again = Gate(a, lambda: started.get(a, 0) >= 2).install(monkeypatch)
    pool = LogCleaner(manager, _policy(threads=1).cleaner, clock)
    pool.start()
    try:
        assert gate.reached.wait(WAIT) and truncated.wait(WAIT)
        _eventually(lambda: again.reached.is_set() or bool(manager.uncleanable_partitions()), clock, "the abort")
        assert not manager.uncleanable_partitions(), manager.uncleanable_partitions()
        assert pool.results == []  # aborted, not finished
        assert leftover_files(root / a.dir_name) == []
        assert _checkpoints(root).get(a, 0) == 0
        view = consumer_view(root / a.dir_name, CONFIG)
        assert view.live == expected.live and view.max_offset < offset
        again.release.set()
        _eventually(lambda: bool(pool.results), clock, "the clean of the truncated log")
        _eventually(lambda: _checkpoints(root).get(a) == pool.results[0].end_offset, what="the checkpoint")
        assert pool.results[0].end_offset <= offset
    finally:
        gate.release.set()
        again.release.set()
        pool.shutdown()
    view = consumer_view(root / a.dir_name, CONFIG)
    assert view.live == expected.live and view.problems == []
    assert leftover_files(root) == []


def test_kafkas_truncation_protocol_during_a_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LogManager's way (§6.6): abortAndPauseCleaning (waits for the running clean), truncate
    below the cleaned part, maybeTruncateCheckpoint to the new active segment, resume; the
    next clean starts from there and keeps every surviving key."""
    root = tmp_path / "dir"
    _log_dir(root, topics=("a",))
    a = TopicPartition("a", 0)
    clock = MockTime(NOW_MS)
    policy = _policy(threads=1)
    first_end = _active_base(root / a.dir_name)
    manager, pool = _start(root, clock, policy)
    try:
        _eventually(lambda: _checkpoints(root).get(a) == first_end, clock, "the first clean")
    finally:
        pool.shutdown()
    # More data arrives, and is being cleaned when the log is truncated below the cleaned part.
    end = generate_partition(root / a.dir_name, seed=9, records=1_500, keys=200, config=CONFIG, producer_epoch=1)
    write_high_watermarks(root, {a: end})
    offset = _segment_bases(root / a.dir_name)[2] + 3
    assert offset < first_end
    gate = Gate(a, _rewriting(root / a.dir_name)).install(monkeypatch)
    manager, pool = _start(root, clock, policy)
    try:
        assert gate.reached.wait(WAIT)
        _, paused, box = _in_thread(lambda: manager.abort_and_pause_cleaning(a))
        assert not paused.wait(0.2)
        gate.release.set()
        assert paused.wait(WAIT) and "error" not in box
        assert leftover_files(root / a.dir_name) == []
        the_log = manager.logs()[a].log
        the_log.truncate_to(offset)
        active = the_log.active_segment
        assert active is not None
        manager.maybe_truncate_checkpoint(LogDirectory(root), a, active.base_offset)
        truncated_checkpoint = active.base_offset
        assert _checkpoints(root)[a] == truncated_checkpoint <= offset
        manager.resume_cleaning([a])
        assert manager.state(a) is None
    finally:
        gate.release.set()
        pool.shutdown()
    # Persist the truncated indexes (Log.truncate_to cuts only the .log file on disk at once;
    # a broker's truncation cuts the index files too) before another writer appends.
    the_log.close()
    # The log grows again; the next clean goes on from the lowered checkpoint.
    truncated = consumer_view(root / a.dir_name, CONFIG)
    expected_dir = tmp_path / "expected" / a.dir_name
    shutil.copytree(root / a.dir_name, expected_dir)
    for directory in (root / a.dir_name, expected_dir):
        more = generate_partition(directory, seed=10, records=1_500, keys=200, config=CONFIG, producer_epoch=2)
    write_high_watermarks(root, {a: more})
    expected = consumer_view(expected_dir, CONFIG)
    manager, pool = _start(root, clock, policy)
    try:
        _eventually(lambda: bool(pool.results), clock, "the clean after the truncation")
        result = pool.results[0]
        assert result.first_dirty_offset == truncated_checkpoint < result.end_offset
        _eventually(lambda: _checkpoints(root).get(a) == result.end_offset, what="the checkpoint")
    finally:
        pool.shutdown()
    view = consumer_view(root / a.dir_name, CONFIG)
    assert view.problems == [] and leftover_files(root) == []
    assert view.live == expected.live
    assert truncated.max_offset < offset


# -- shutdown during a clean ----------------------------------------------------------------


def test_shutdown_during_a_clean_is_prompt_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ends = _log_dir(tmp_path)
    a = TopicPartition("a", 0)
    before = {tp: broker_view(tmp_path / tp.dir_name, CONFIG) for tp in ends}
    clean_end = {tp: _active_base(tmp_path / tp.dir_name) for tp in ends}
    gate = Gate(a, _rewriting(tmp_path / a.dir_name)).install(monkeypatch)
    clock = MockTime(NOW_MS)
    manager, pool = _start(tmp_path, clock, _policy(threads=2))
    assert gate.reached.wait(WAIT)
    assert leftover_files(tmp_path / a.dir_name)  # mid-rewrite: a .cleaned segment exists
    started = time.monotonic()
    pool.shutdown()  # the held thread sees the shutdown at its next check
    assert time.monotonic() - started < 5.0
    assert all(not t.is_alive() for t in pool.threads)
    assert pool.dead_thread_count == 0
    assert leftover_files(tmp_path) == []
    assert manager.state(a) is None and not manager.uncleanable_partitions()
    assert broker_view(tmp_path / a.dir_name, CONFIG) == before[a]
    # A new pool finishes the job.
    pool = LogCleaner(manager, _policy(threads=2).cleaner, clock)
    gate.release.set()
    pool.start()
    try:
        _eventually(
            lambda: all(_checkpoints(tmp_path).get(tp) == clean_end[tp] for tp in ends),
            clock,
            "every partition cleaned",
        )
    finally:
        pool.shutdown()


def test_shutdown_of_free_running_threads_is_prompt(tmp_path: Path) -> None:
    """No gate: real threads cleaning bigger logs, shut down once a rewrite is under way."""
    ends = _log_dir(tmp_path, topics=("a", "b", "c"), records=10_000)
    before = {tp: consumer_view(tmp_path / tp.dir_name, CONFIG).live for tp in ends}
    clock = MockTime(NOW_MS)
    _, pool = _start(tmp_path, clock, _policy(threads=2))
    _eventually(lambda: bool(leftover_files(tmp_path)) or bool(pool.results), what="a rewrite")
    started = time.monotonic()
    pool.shutdown()
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"shutdown took {elapsed:.2f} s"
    assert all(not t.is_alive() for t in pool.threads)
    assert leftover_files(tmp_path) == []
    assert len(pool.results) < len(ends), "every clean had finished: the shutdown came too late to test anything"
    for tp in ends:  # finished, half-swapped or untouched: every key as before
        view = consumer_view(tmp_path / tp.dir_name, CONFIG)
        assert view.live == before[tp] and view.problems == []


# -- dead threads ---------------------------------------------------------------------------


def test_a_thread_that_dies_is_detected_and_restarted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ends = _log_dir(tmp_path)
    clean_end = {tp: _active_base(tmp_path / tp.dir_name) for tp in ends}
    clock = MockTime(NOW_MS)
    real = LogCleanerManager.grab_filthiest_compacted_log
    failures = {"left": 1}

    def flaky(self, now, pre_stats=None):
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("injected: not a partition's fault")
        return real(self, now, pre_stats)

    monkeypatch.setattr(LogCleanerManager, "grab_filthiest_compacted_log", flaky)
    manager, pool = _start(tmp_path, clock, _policy(threads=1))
    try:
        _eventually(lambda: not pool.threads[0].is_alive(), what="the thread to die")
        assert pool.dead_thread_count == 1
        assert not manager.uncleanable_partitions()  # not blamed on a partition
        assert _checkpoints(tmp_path) == {}
        assert pool.restart_dead_threads() == 1
        assert pool.dead_thread_count == 0 and pool.threads[0].is_alive()
        assert pool.restart_dead_threads() == 0
        _eventually(
            lambda: all(_checkpoints(tmp_path).get(tp) == clean_end[tp] for tp in ends),
            clock,
            "every partition cleaned by the restarted thread",
        )
    finally:
        pool.shutdown()
    assert pool.dead_thread_count == 0


# -- one bad partition ------------------------------------------------------------------------


def _corrupt_second_segment(directory: Path) -> None:
    """Garble the records of an uncompressed data batch in the second segment: its header
    (what a producer-state replay reads) stays valid, so the damage is found by the clean
    itself, when it decodes the records."""
    second = sorted(p for p in directory.iterdir() if p.suffix == ".log")[1]
    data = bytearray(second.read_bytes())
    position = 0
    while position < len(data):
        length = int.from_bytes(data[position + 8 : position + 12], "big")
        attributes = int.from_bytes(data[position + 21 : position + 23], "big")
        records = int.from_bytes(data[position + 57 : position + 61], "big")
        if attributes & 0x7 == 0 and not attributes & 0x20 and records > 1:
            data[position + 61 : position + 61 + 8] = b"\xff" * 8
            second.write_bytes(bytes(data))
            return
        position += 12 + length
    raise AssertionError(f"no uncompressed data batch in {second}")


def _run_cli(root: Path, policy_file: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CLI), "clean", str(root), "--policy", str(policy_file), "--now-ms", str(NOW_MS), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _policy_file(tmp_path: Path, threads: int) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "mode: compact\ntopics:\n"
        f'  - match: ".*"\n    cleanupPolicy: compact\n    segmentBytes: {SEGMENT_BYTES}\n'
        f"cleaner:\n  threads: {threads}\n  dedupeBufferSize: 4194304\n  backoffMs: 100\n"
    )
    return path


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("z", id="bad-partition-cleaned-last"),
        pytest.param(
            "a",
            id="bad-partition-cleaned-first",
        ),
    ],
)
def test_a_corrupt_partition_is_uncleanable_and_the_others_are_cleaned(tmp_path: Path, bad: str) -> None:
    """CLI: exit 3, the partition and the reason on stderr, its files untouched, every
    other partition cleaned. With one thread and equal dirty ratios the partitions are
    chosen in name order, so "a" is the first and "z" the last."""
    root = tmp_path / "dir"
    topics = ("a", "m", "z")
    _log_dir(root, topics=topics, records=1_000)
    broken = TopicPartition(bad, 0)
    _corrupt_second_segment(root / broken.dir_name)
    untouched = snapshot_dir(root / broken.dir_name)
    others = [TopicPartition(t, 0) for t in topics if t != bad]
    before = {tp: consumer_view(root / tp.dir_name, CONFIG) for tp in others}
    proc = _run_cli(root, _policy_file(tmp_path, threads=1), "--json")
    assert proc.returncode == 3, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("kafka-cleaner: partition")]
    assert len(lines) == 1 and f"partition {broken} " in lines[0], proc.stderr
    assert f"{broken.dir_name}/" in lines[0] and ".log, byte " in lines[0], lines[0]  # the file and where in it
    assert snapshot_dir(root / broken.dir_name) == untouched
    checkpoints = _checkpoints(root)
    for tp in others:
        assert checkpoints.get(tp) == _active_base(root / tp.dir_name), f"{tp} was not cleaned"
        assert consumer_view(root / tp.dir_name, CONFIG).live == before[tp].live
    assert leftover_files(root) == []


def test_a_corrupt_partition_does_not_stop_other_threads(tmp_path: Path) -> None:
    """In-process, long-running mode: the failing partition is reported with its reason,
    the thread survives, every other partition is cleaned."""
    topics = ("a", "b", "c", "d")
    _log_dir(tmp_path, topics=topics, records=1_000)
    broken = TopicPartition("b", 0)
    _corrupt_second_segment(tmp_path / broken.dir_name)
    untouched = snapshot_dir(tmp_path / broken.dir_name)
    others = [TopicPartition(t, 0) for t in topics if t != "b"]
    clean_end = {tp: _active_base(tmp_path / tp.dir_name) for tp in others}
    clock = MockTime(NOW_MS)
    manager, pool = _start(tmp_path, clock, _policy(threads=2))
    try:
        _eventually(
            lambda: (
                all(_checkpoints(tmp_path).get(tp) == clean_end[tp] for tp in others)
                and bool(manager.uncleanable_partitions())
            ),
            clock,
            "the others cleaned and b reported",
        )
        reasons = {tp: r for tps in manager.uncleanable_partitions().values() for tp, r in tps.items()}
        assert list(reasons) == [broken]
        assert f"{broken.dir_name}/" in reasons[broken] and ".log, byte " in reasons[broken]
        assert pool.dead_thread_count == 0 and all(t.is_alive() for t in pool.threads)
        report = {r.topic_partition: r for r in manager.report(clock.milliseconds())}
        assert report[broken].reason == "uncleanable" and report[broken].uncleanable_reason == reasons[broken]
    finally:
        pool.shutdown()
    assert snapshot_dir(tmp_path / broken.dir_name) == untouched


def test_check_cleaning_aborted_raises_only_when_aborted(tmp_path: Path) -> None:
    """The cleaner's side of an abort: ``check_cleaning_aborted`` (via ``check_done``) raises
    LogCleaningAbortedError exactly while the state is Aborted."""
    _log_dir(tmp_path, topics=("a",), records=300)
    a = TopicPartition("a", 0)
    manager = LogCleanerManager([LogDirectory(tmp_path)], _policy(), MockTime(NOW_MS))
    assert manager.grab_filthiest_compacted_log(NOW_MS) is not None
    manager.check_cleaning_aborted(a)
    _, paused, _ = _in_thread(lambda: manager.abort_and_pause_cleaning(a))
    _eventually(lambda: manager.state(a) == "LogCleaningAborted", what="the abort")
    with pytest.raises(LogCleaningAbortedError):
        manager.check_cleaning_aborted(a)
    manager.done_cleaning(a, LogDirectory(tmp_path), 123)  # what a thread does after the abort
    assert paused.wait(WAIT)
    assert manager.state(a) == "LogCleaningPaused(1)"
    assert _checkpoints(tmp_path).get(a) is None  # an aborted clean moves no checkpoint
    manager.check_cleaning_aborted(a)
