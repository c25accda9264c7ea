"""``kafka-cleaner diverged`` (cleaner/manifestations.py): each manifestation is named on two
replicas written batch by batch as the race leaves them, on the suspect only; and no false
alarm: replicas in sync that their cleaners compacted to different points, tombstones and
markers removed past their horizons on one and kept on the other, agree key by key, both ways
round. The same manifestations are played on real clusters of both Kafka lines in
tests/kafka/test_compaction_replication_race_kafka.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import ABORT, COMMIT, LogWriter, all_batches, clean_round, make_cleaner, records_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleaner.clock import MockTime
from cleaner.manifestations import Replica, compare
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.topic_partition import parse_partition_dir

CLI = Path(sys.executable).with_name("kafka-cleaner")
NOW = 1_700_000_000_000
DAY = 86_400_000
SLICED = 50
"""A ``max_keys`` that slices the generated logs' 400 keys."""
POLICY = "mode: compact\ntopics:\n  - match: '.*'\n    cleanupPolicy: compact\n"


def _run(*args: str) -> None:
    done = subprocess.run([str(CLI), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _generated(root: Path, seed: int, transactions: float, tombstones: float) -> Path:
    d = root / "original"
    _run("generate", str(d), "--topics", "1", "--partitions", "1", "--records", "3000", "--keys", "400",
         "--tombstones", str(tombstones), "--transactions", str(transactions), "--segment-bytes", "65536",
         "--value-bytes", "40", "--seed", str(seed), "--now-ms", str(NOW), "--hours", "1")
    return d


def _cleaned(root: Path, original: Path, days: list[int]) -> Path:
    d = root / "cleaned"
    shutil.copytree(original, d)
    (root / "policy.yaml").write_text(POLICY)
    first, *later = days
    _run("clean", str(d), "--policy", str(root / "policy.yaml"), "--now-ms", str(NOW + first * DAY), "--no-progress")
    [partition] = [p for p in d.iterdir() if p.is_dir()]
    for day in later:  # a whole clean again, past the horizons the last one stamped: they go
        now = NOW + day * DAY
        clean_round(partition, first_dirty=0, now=now, cleaner=make_cleaner(time=MockTime(now)))
    return d


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), transactions=st.sampled_from([0.0, 0.3, 0.8]),
       tombstones=st.sampled_from([0.0, 0.1, 0.4]), days=st.sampled_from([[0], [2], [0, 3], [2, 5, 9]]))
def test_in_sync_replicas_compacted_differently_agree(tmp_path_factory: pytest.TempPathFactory, seed: int,
                                                      transactions: float, tombstones: float,
                                                      days: list[int]) -> None:
    root = tmp_path_factory.mktemp("replicas")
    original = _generated(root, seed, transactions, tombstones)
    cleaned = _cleaned(root, original, days)
    [tp_dir] = [p for p in original.iterdir() if p.is_dir()]
    tp = parse_partition_dir(tp_dir.name)
    raw, compacted = Replica("raw", (original,)), Replica("compacted", (cleaned,))
    assert compare(raw, compacted, tp) == ([], dict.fromkeys(range(1, 5), 0))
    assert compare(compacted, raw, tp) == ([], dict.fromkeys(range(1, 5), 0))
    # Slicing the key space changes nothing but memory (400 keys, at most 50 a slice: 8 or more
    # slices; 7 a slice took 64-128 slices, a full read of both logs each, for no more coverage).
    assert compare(compacted, raw, tp, max_keys=SLICED) == ([], dict.fromkeys(range(1, 5), 0))


def test_a_replica_that_missed_removed_tombstones_is_named_key_by_key(tmp_path: Path) -> None:
    """A replica that stopped fetching halfway (the log truncated there) against one whose
    cleaner, past the delete horizons, removed the tombstones that came after: each key whose
    value the stale replica still serves and the other no longer holds at all is named as
    manifestation 1, on the stale replica only; with the key space sliced, the same keys."""
    original = _generated(tmp_path, 7, 0.0, 0.3)
    cleaned = _cleaned(tmp_path, original, [2, 5])
    [tp_dir] = [p for p in original.iterdir() if p.is_dir()]
    tp = parse_partition_dir(tp_dir.name)
    stale = tmp_path / "stale"
    shutil.copytree(original, stale)
    log = Log.open(stale / tp_dir.name, LogConfig())
    log.truncate_to(log.log_end_offset // 2)
    log.close()

    stale_latest = {key: value for _, key, value in records_of(all_batches(stale / tp_dir.name))}
    held = {key for _, key, _ in records_of(all_batches(cleaned / tp_dir.name))}
    expected = {key for key, value in stale_latest.items() if value is not None and key not in held}
    assert expected, "the scenario has no key to find"

    for max_keys in (4_000_000, SLICED):
        findings, counts = compare(Replica("cleaned", (cleaned,)), Replica("stale", (stale,)), tp, max_keys=max_keys)
        assert {f.key for f in findings} == expected
        assert {(f.manifestation, f.replica) for f in findings} == {(1, "stale")}
        assert counts == {1: len(expected), 2: 0, 3: 0, 4: 0}
    assert compare(Replica("stale", (stale,)), Replica("cleaned", (cleaned,)), tp)[0] == []


def test_a_replica_without_the_partition_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    original = _generated(tmp_path, 1, 0.0, 0.0)
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run([str(CLI), "diverged", "--in-sync", str(original), "--replica", str(empty),
                           "--topic", "topic-0", "--partition", "0"], capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"replica: topic-0-0 is not on {empty}" in done.stderr


# -- each manifestation, on two replicas written batch by batch --------------------------------
# The in-sync replica as its cleaner left it (what it removed is a gap in its offsets), the
# suspect as it was when it went away plus what it fetched after it came back: the shapes the
# real clusters of tests/kafka/test_compaction_replication_race_kafka.py leave.

P = 7000


def _replicas(tmp_path: Path, write_in_sync, write_suspect):  # type: ignore[no-untyped-def]
    out = []
    for name, write in (("in-sync", write_in_sync), ("suspect", write_suspect)):
        writer = LogWriter(tmp_path / name / "accounts-0")
        write(writer)
        writer.close()
        out.append(Replica(name, (tmp_path / name,)))
    return out


def _named(in_sync: Replica, suspect: Replica) -> list[tuple[int, str, int, bytes | None, int | None]]:
    findings, counts = compare(in_sync, suspect, parse_partition_dir("accounts-0"))
    assert sum(counts.values()) == len(findings)
    assert compare(suspect, in_sync, parse_partition_dir("accounts-0"))[0] == [], "named on the in-sync replica"
    return [(f.manifestation, f.replica, f.offset, f.key, f.producer_id) for f in findings]


def test_1_deleted_data_reappears(tmp_path: Path) -> None:
    def in_sync(w):  # type: ignore[no-untyped-def]
        w.data([b"other"])
        w.data([b"filler"], gap=2)  # the value (1) and its tombstone (2) removed by its cleaner

    def suspect(w):  # type: ignore[no-untyped-def]
        w.data([b"other"])
        w.data([b"user-42"])  # away from here on; back, it fetched from 3
        w.data([b"filler"], gap=1)

    assert _named(*_replicas(tmp_path, in_sync, suspect)) == [(1, "suspect", 1, b"user-42", None)]


def test_2_aborted_data_served_as_committed(tmp_path: Path) -> None:
    def in_sync(w):  # type: ignore[no-untyped-def]
        w.data([b"other"])
        w.data([b"payment-8"], pid=P, txn=True, gap=2)  # the refund (1) and its ABORT (2) removed
        w.marker(COMMIT, P)

    def suspect(w):  # type: ignore[no-untyped-def]
        w.data([b"other"])
        w.data([b"payment-7"], pid=P, txn=True)  # the refund; the ABORT never came
        w.data([b"payment-8"], pid=P, txn=True, gap=1)  # fetched: joins the open transaction
        w.marker(COMMIT, P)

    assert _named(*_replicas(tmp_path, in_sync, suspect)) == [(2, "suspect", 1, b"payment-7", P)]


def test_3_committed_data_hidden_as_aborted(tmp_path: Path) -> None:
    def in_sync(w):  # type: ignore[no-untyped-def]
        # The balance (0), the committed deletion (1) and its COMMIT (2) removed by its cleaner.
        w.data([b"account-4"], pid=P, txn=True, gap=3)
        w.marker(ABORT, P)

    def suspect(w):  # type: ignore[no-untyped-def]
        w.data([b"account-3"], [b"balance:120"])
        w.data([b"account-3"], [None], pid=P, txn=True)  # the deletion; the COMMIT never came
        w.data([b"account-4"], pid=P, txn=True, gap=1)
        w.marker(ABORT, P)  # ends the transaction from the deletion on

    assert _named(*_replicas(tmp_path, in_sync, suspect)) == [(3, "suspect", 1, b"account-3", P)]


def test_4_read_committed_frozen_at_a_stale_lso(tmp_path: Path) -> None:
    def in_sync(w):  # type: ignore[no-untyped-def]
        w.data([b"other"])
        w.data([b"order-5"], [b"state:shipped"], gap=2)  # the paid state (1) and its COMMIT (2) removed
        w.data([b"order-6"])

    def suspect(w):  # type: ignore[no-untyped-def]
        w.data([b"other"])
        w.data([b"order-5"], [b"state:paid"], pid=P, txn=True)  # the COMMIT never came
        w.data([b"order-5"], [b"state:shipped"], gap=1)
        w.data([b"order-6"])

    assert _named(*_replicas(tmp_path, in_sync, suspect)) == [(4, "suspect", 1, None, P)]
