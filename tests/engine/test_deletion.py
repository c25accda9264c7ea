"""The deletion deadline per partition (issue 25.2): ages, causes, the bound and the cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from engine_helpers import BASE_TS, DAY, NOW, TP, LogWriter
from metadata_logs import TOPIC_ID, fence, isr_change, partition_record, register_broker, topic_record, write_metadata

from cleaner import cleaning
from cleaner.clock import MockTime
from cleaner.config import PolicyError, parse_policy
from cleaner.deletion import DeletionCache, at_risk
from cleaner.records.control import ControlRecordType
from cleaner.storage.checkpoint import OffsetCheckpointFile

HOUR = 3_600_000


def _policy(**rule: object) -> object:
    return parse_policy(
        {
            "mode": "compact",
            "topics": [{"match": "topic", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01, **rule}],
            "cleaner": {"dedupeBufferSize": 1 << 20},
        }
    )


def _status(root: Path, policy: object, now: int = NOW, cache: DeletionCache | None = None) -> cleaning.PartitionStatus:
    cache = cache or DeletionCache.for_policy(policy)  # type: ignore[arg-type]
    (status,) = cleaning.status([root], policy, MockTime(now), deletion=cache)  # type: ignore[arg-type]
    return status


def _hw(root: Path, w: LogWriter) -> None:
    OffsetCheckpointFile(root / "replication-offset-checkpoint").write({TP: w.next_offset})


def test_an_overwrite_in_the_unrolled_active_segment_is_held_by_it(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a", b"b"])
    w.data([b"a"], timestamps=[BASE_TS + 5_000])  # supersedes offset 0 at BASE_TS + 5 s
    w.close()
    _hw(tmp_path, w)
    s = _status(tmp_path, _policy(deletionDeadlineMs=HOUR)).deletion
    assert s is not None
    assert s.oldest_superseded_age_ms == NOW - BASE_TS - 5_000
    assert s.superseded_records == 1
    assert s.held_back_by == "activeSegment"
    assert s.deadline_ms == HOUR and s.breached
    assert s.remaining_ms == HOUR - (NOW - BASE_TS - 5_000)
    assert not s.bounded
    as_json = _status(tmp_path, _policy(deletionDeadlineMs=HOUR)).as_dict()["deletion"]
    assert as_json["heldBackBy"] == "activeSegment" and as_json["breached"] is True


def test_the_age_is_since_the_overwrite_not_since_the_old_value(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a"], timestamps=[NOW - 30 * DAY])
    w.data([b"a"], timestamps=[NOW - 10_000])
    w.close()
    _hw(tmp_path, w)
    s = _status(tmp_path, _policy(deletionDeadlineMs=HOUR)).deletion
    assert s is not None and s.oldest_superseded_age_ms == 10_000 and not s.breached
    assert not at_risk(s)


def test_no_deadline_by_default_and_max_compaction_lag_when_set(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a", b"a"])
    w.close()
    _hw(tmp_path, w)
    plain = _status(tmp_path, _policy()).deletion
    assert plain is not None and plain.deadline_ms is None and not plain.breached and plain.remaining_ms is None
    lag = _status(tmp_path, _policy(maxCompactionLagMs=DAY)).deletion
    assert lag is not None and lag.deadline_ms == DAY and lag.breached
    own = _status(tmp_path, _policy(maxCompactionLagMs=DAY, deletionDeadlineMs=2 * DAY)).deletion
    assert own is not None and own.deadline_ms == 2 * DAY


@pytest.mark.parametrize("bad", [0, -1, "1h", 1.5])
def test_the_deadline_is_validated(bad: object) -> None:
    with pytest.raises(PolicyError, match=r"topics\[0\]\.deletionDeadlineMs"):
        _policy(deletionDeadlineMs=bad)


def test_a_rolled_eligible_partition_nobody_cleans_is_held_by_the_cleaner_then_cleared(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a", b"b"])
    w.data([b"a"])
    w.roll()
    w.data([b"c"])
    w.close()
    _hw(tmp_path, w)
    policy = _policy(deletionDeadlineMs=HOUR)
    s = _status(tmp_path, policy).deletion
    assert s is not None and s.held_back_by == "cleaner" and s.breached and at_risk(s)
    cleaning.clean([tmp_path], policy, MockTime(NOW))  # type: ignore[arg-type]
    after = _status(tmp_path, policy).deletion
    assert after is not None
    assert after.oldest_superseded_age_ms is None and after.superseded_records == 0 and not after.breached
    assert after.held_back_by is None


def test_a_dirty_ratio_below_the_minimum_holds_it(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"k%d" % i for i in range(50)])
    w.roll()
    w.data([b"k0"])
    w.roll()
    w.data([b"c"])
    w.close()
    _hw(tmp_path, w)
    OffsetCheckpointFile(tmp_path / "cleaner-offset-checkpoint").write({TP: 50})  # 50 keys cleaned, 1 dirty
    s = _status(tmp_path, _policy(minCleanableDirtyRatio=0.99)).deletion
    assert s is not None and s.held_back_by == "dirtyRatio"


def test_min_compaction_lag_holds_it(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a", b"a"], timestamps=[NOW - 1_000, NOW - 500])
    w.roll()
    w.data([b"c"])
    w.close()
    _hw(tmp_path, w)
    s = _status(tmp_path, _policy(minCompactionLagMs=HOUR)).deletion
    assert s is not None and s.held_back_by == "minCompactionLag" and s.oldest_superseded_age_ms == 500


def test_a_hanging_transaction_holds_it(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"x"], pid=7, epoch=1, txn=True)  # never ends: the LSO stays at offset 0
    w.roll()
    w.data([b"a", b"a"])
    w.roll()
    w.data([b"c"])
    w.close()
    _hw(tmp_path, w)
    s = _status(tmp_path, _policy()).deletion
    assert s is not None and s.held_back_by == "lso"
    w2 = LogWriter(tmp_path / "other" / TP.dir_name)
    w2.data([b"x"], pid=7, epoch=1, txn=True)
    w2.marker(ControlRecordType.COMMIT, 7, epoch=1)
    w2.roll()
    w2.data([b"a", b"a"])
    w2.roll()
    w2.data([b"c"])
    w2.close()
    _hw(tmp_path / "other", w2)
    ended = _status(tmp_path / "other", _policy()).deletion
    assert ended is not None and ended.held_back_by == "cleaner"


def _a_lone_tombstone(root: Path) -> None:
    """A tombstone for a key with no other record, in a rolled segment of a log with a high
    watermark at its end."""
    w = LogWriter(root / TP.dir_name)
    w.data([b"a", b"b"], [None, b"v"])
    w.roll()
    w.data([b"b"])
    w.roll()
    w.data([b"c"])
    w.close()
    _hw(root, w)


def test_a_tombstone_past_its_horizon_still_on_disk(tmp_path: Path) -> None:
    _a_lone_tombstone(tmp_path)
    policy = _policy(deleteRetentionMs=HOUR, deletionDeadlineMs=2 * HOUR)
    cleaning.clean([tmp_path], policy, MockTime(NOW))  # type: ignore[arg-type]  # stamps NOW + HOUR
    cache = DeletionCache.for_policy(policy)  # type: ignore[arg-type]
    before = _status(tmp_path, policy, NOW + HOUR - 1, cache).deletion
    assert before is not None and before.oldest_expired_tombstone_age_ms is None
    later = _status(tmp_path, policy, NOW + 4 * HOUR, cache).deletion
    assert later is not None
    assert later.oldest_expired_tombstone_age_ms == 3 * HOUR and later.breached
    assert later.held_back_by == "activeSegment"  # nothing dirty: no clean until the active segment rolls


def test_keys_beyond_the_offset_map_make_the_age_a_lower_bound(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    keys = [b"key-%05d" % i for i in range(3000)]
    w.data(keys, timestamps=[BASE_TS] * len(keys))
    w.roll()
    w.data(keys, timestamps=[BASE_TS + 1] * len(keys))  # every key overwritten, in a later segment
    w.close()
    _hw(tmp_path, w)
    policy = _policy()
    exact = DeletionCache(1 << 20, 0.9, 1)
    small = DeletionCache(8 * 1024, 0.9, 1)  # a few hundred keys
    full = _status(tmp_path, policy, cache=exact).deletion
    cut = _status(tmp_path, policy, cache=small).deletion
    assert full is not None and not full.bounded and full.superseded_records == 3000
    assert cut is not None and cut.bounded and cut.superseded_records < 3000


def test_facts_are_read_again_only_when_segments_changed_and_the_interval_passed(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)  # kept open: it appends like the broker, under the scans
    w.data([b"a", b"a"])
    w.log.flush()
    _hw(tmp_path, w)
    policy = _policy()
    cache = DeletionCache(1 << 20, 0.9, interval_ms=HOUR)
    first = _status(tmp_path, policy, NOW, cache).deletion
    read = cache.bytes_read
    assert first is not None and read > 0
    same = _status(tmp_path, policy, NOW + 2 * HOUR, cache).deletion  # unchanged: not read
    assert cache.bytes_read == read and same is not None and same.computed_at_ms == NOW
    w.data([b"b"])
    w.log.flush()
    again = _status(tmp_path, policy, NOW + 2 * HOUR + 1, cache).deletion  # changed, the interval passed
    assert again is not None and again.computed_at_ms == NOW + 2 * HOUR + 1 and cache.bytes_read > read
    read = cache.bytes_read
    w.data([b"c"])
    w.log.flush()
    soon = _status(tmp_path, policy, NOW + 2 * HOUR + 2, cache).deletion  # changed, within the interval
    assert cache.bytes_read == read and soon is not None and soon.computed_at_ms == NOW + 2 * HOUR + 1
    w.close()


def test_the_status_line_names_the_ages_the_deadline_and_the_cause(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a", b"a"], timestamps=[NOW - 3 * HOUR, NOW - 2 * HOUR])
    w.close()
    _hw(tmp_path, w)
    s = _status(tmp_path, _policy(deletionDeadlineMs=HOUR)).deletion
    assert s is not None
    assert s.describe() == "deletion: superseded records for 2.0h; deadline 1.0h BREACHED; held back by activeSegment"


def test_a_replica_out_of_sync_holds_an_expired_tombstone(tmp_path: Path) -> None:
    """Issue 24, item 3: while another replica is out of the ISR (the metadata log on the disk
    says so) a clean keeps every tombstone past its horizon, so the deletion it holds back is
    named ``replicaOutOfSync`` (before: ``cleaner``, which sent a person on call to a cleaner
    that was working); with every replica in sync the same clean removes it."""

    def log_dir(root: Path, *later: tuple[int, list[bytes]]) -> Path:
        _a_lone_tombstone(root)
        (root / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=test\n")
        t0 = NOW - DAY
        topic = [topic_record(TP.topic, TOPIC_ID), partition_record(0, [1, 2], [1, 2], 1, TOPIC_ID)]
        write_metadata(root, [(t0, [register_broker(b, fenced=False) for b in (1, 2)]), (t0, topic), *later])
        return root

    # With the metadata log on the disk the topic's delete.retention.ms is the cluster's: Kafka's
    # default of a day, which the policy's hour gives way to (issue 27, item 7).
    policy = _policy(deleteRetentionMs=HOUR, deletionDeadlineMs=2 * HOUR)
    out = [(NOW - DAY + 1_000, [fence(2), isr_change(0, [1], topic_id=TOPIC_ID)])]
    for root, hold in ((log_dir(tmp_path / "out", *out), True), (log_dir(tmp_path / "in-sync"), False)):
        cleaning.clean([root], policy, MockTime(NOW))  # type: ignore[arg-type]  # stamps NOW + DAY
        w = LogWriter(root / TP.dir_name, append=True)  # more dirty data: eligible again
        w.data([b"e"])  # a new key: nothing superseded, the tombstone is what waits
        w.roll()
        w.data([b"d"])
        w.close()
        _hw(root, w)
        later = _status(root, policy, NOW + 2 * DAY).deletion
        assert later is not None and later.oldest_expired_tombstone_age_ms == DAY and later.breached
        assert later.held_back_by == ("replicaOutOfSync" if hold else "cleaner"), root
        cleaning.clean([root], policy, MockTime(NOW + 2 * DAY))  # type: ignore[arg-type]
        after = _status(root, policy, NOW + 2 * DAY).deletion
        assert after is not None
        if hold:  # the clean kept it, and says why
            assert after.oldest_expired_tombstone_age_ms == DAY and after.held_back_by == "replicaOutOfSync"
        else:
            assert after.oldest_expired_tombstone_age_ms is None and after.held_back_by is None


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_facts_of_a_small_partition_touch_only_the_map_its_offsets_can_fill(tmp_path: Path) -> None:
    """A partition of 20,000 offsets read with the cleaner's default 128 MiB map: its keys go in
    a table of ~0.4 MB at the start of the map, the rest is never faulted in (on the whole
    table they land on pages all over it: 60-128 MiB resident, by page size)."""
    w = LogWriter(tmp_path / TP.dir_name)
    keys = [b"key-%05d" % i for i in range(10_000)]
    w.data(keys, timestamps=[BASE_TS] * len(keys))
    w.data(keys, timestamps=[BASE_TS + 1] * len(keys))  # every key overwritten once
    w.close()
    _hw(tmp_path, w)
    cache = DeletionCache(128 * 1024 * 1024, 0.9, 1)
    before = _resident_bytes()
    facts = _status(tmp_path, _policy(), cache=cache).deletion
    assert _resident_bytes() - before < 8 * 1024 * 1024
    assert facts is not None and facts.superseded_records == 10_000 and not facts.bounded
