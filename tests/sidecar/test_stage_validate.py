"""Every reason the stage commit refuses a set (each branch of ``stage.validate``), one
test each: the broker's directory is changed the way Kafka (or a race with it) would
change it after the set was staged, the commit runs under ``.lock`` with the broker
stopped, and

- the refusal names what it found (the file, the offset, the reason);
- the set is deleted, nothing is committed and ``cleaned-to`` is not written;
- nothing outside the stage area changed: names, kinds, sizes, hashes, owners, modes and
  mtimes of every file and directory of the log dir (a re-created directory, a file the
  commit rewrote with the same bytes, a changed mode: each is a difference).

Two branches are not reachable through ``commit_log_dir`` and are asked of ``validate``
directly: a partition dir whose name is not a partition's (``staged_partitions`` never
lists one) and an unfinished swap (the commit completes Kafka's start-up work first, as
the broker would; ``stage status`` asks ``validate`` with the broker running).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from sidecar_helpers import next_scan
from test_stage import Pod, broker_files

from cleaner.clock import MockTime
from cleaner.sidecar import stage
from cleaner.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.metadata import LEADER_EPOCH_CHECKPOINT, read_leader_epoch_checkpoint
from cleaner.storage.segment import LOG_SUFFIX
from cleaner.storage.topic_partition import TopicPartition

ONE = {"partitions": 1, "records": 4_000, "keys": 1_500}


def staged(tmp_path: Path, make_log_dir) -> tuple[Pod, TopicPartition, Path, stage.StagedSet]:
    """A partition with a complete set, the broker stopped."""
    pod = Pod(tmp_path, make_log_dir, generated=ONE)
    next_scan(pod.sc)
    pod.stage_all()
    pod.stop_broker()
    del pod.sc  # killed: no termination commit
    tp = pod.tps[0]
    pdir = pod.data / tp.dir_name
    s = stage.load(pdir)
    assert s is not None and len(s.sources) >= 3, s
    return pod, tp, pdir, s


def commit(log_dir: Path) -> stage.CommitReport:
    clock = MockTime(1_700_000_000_000)
    return stage.commit_log_dir(log_dir, clock, clock.nanoseconds() + 60 * 10**9, wanted=lambda tp, s: None)


def assert_refused(log_dir: Path, tp: TopicPartition, *fragments: str) -> str:
    """The commit deletes the set, says why (every fragment in its reason) and changes
    nothing outside the stage area."""
    pdir = log_dir / tp.dir_name
    before = broker_files(log_dir)
    report = commit(log_dir)
    assert report.locked and report.committed == [] and report.errors == [], report
    assert [p for p, _ in report.deleted] == [str(tp)], report
    reason = report.deleted[0][1]
    for fragment in fragments:
        assert fragment in reason, (fragment, reason)
    assert broker_files(log_dir) == before, "the refused commit changed the broker's files"
    assert stage.load(pdir) is None and not stage.set_dir(pdir).exists()
    assert stage.cleaned_to(pdir) is None
    return reason


# -- through the commit ------------------------------------------------------------------------


def test_an_unreadable_manifest(tmp_path: Path, make_log_dir) -> None:
    pod, tp, pdir, _ = staged(tmp_path, make_log_dir)
    manifest = stage.set_dir(pdir) / stage.MANIFEST
    manifest.write_bytes(b"{not json")
    assert_refused(pod.data, tp, "the stage manifest", str(manifest), "unreadable")


def test_a_staged_file_that_changed_size(tmp_path: Path, make_log_dir) -> None:
    pod, tp, pdir, s = staged(tmp_path, make_log_dir)
    name = sorted(n for n in s.files if n.endswith(LOG_SUFFIX))[0]
    with open(stage.set_dir(pdir) / name, "ab") as f:
        f.write(b"\0")
    assert_refused(pod.data, tp, f"the staged file {name} changed size")


def test_a_staged_file_that_is_missing(tmp_path: Path, make_log_dir) -> None:
    pod, tp, pdir, s = staged(tmp_path, make_log_dir)
    name = sorted(s.files)[-1]
    (stage.set_dir(pdir) / name).unlink()
    assert_refused(pod.data, tp, f"the staged file {name} is missing")


def test_retention_moved_the_first_segment(tmp_path: Path, make_log_dir) -> None:
    pod, tp, pdir, s = staged(tmp_path, make_log_dir)
    first = s.first_segment_base
    for f in pdir.glob(f"{first:020d}.*"):
        f.unlink()
    second = min(src_base for src_base in s.replaced if src_base != first)
    assert_refused(pod.data, tp, f"the first segment is now {second}, was {first}")


def test_a_delete_records_moved_the_log_start_checkpoint(tmp_path: Path, make_log_dir) -> None:
    """A DeleteRecords inside the first segment: Kafka deletes no segment, it writes the new
    log start to ``log-start-offset-checkpoint`` (records below it must never be served
    again, and a commit would rewrite the segment under it)."""
    pod, tp, _, s = staged(tmp_path, make_log_dir)
    moved = s.first_segment_base + 7
    checkpoint = OffsetCheckpointFile(pod.data / LOG_START_OFFSET_CHECKPOINT)
    checkpoint.write({**checkpoint.read(), tp: moved})
    assert_refused(pod.data, tp, f"log start offset checkpoint moved from {s.log_start_checkpoint} to {moved}")


def test_a_source_segment_gone_from_the_range(tmp_path: Path, make_log_dir) -> None:
    """A middle source segment is no longer there, with its indexes (the first stays):
    the segments in the staged range are not the set's sources."""
    pod, tp, pdir, s = staged(tmp_path, make_log_dir)
    middle = sorted(s.replaced)[1]
    for f in pdir.glob(f"{middle:020d}.*"):
        f.unlink()
    assert_refused(pod.data, tp, f"the segments in [{s.base_offset}, {s.next_offset})", "not the staged set's sources")


def test_a_source_segment_deleted_between_the_listing_and_its_stat(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the listing cannot see: the segment goes right after the commit listed the
    partition dir (a broker is stopped, but another tool may run)."""
    pod, tp, pdir, s = staged(tmp_path, make_log_dir)
    victim = s.sources[-1].name
    real = stage.regular_files
    listed: list[str] = []

    def regular_files(directory: str | os.PathLike[str]) -> list[str]:
        names = real(directory)
        if Path(directory) == pdir and not listed:
            listed.append(victim)
            (pdir / victim).rename(pdir / (victim + ".moved-away"))
        return names

    monkeypatch.setattr(stage, "regular_files", regular_files)
    before = broker_files(pod.data)
    report = commit(pod.data)
    assert listed and report.committed == [] and report.errors == [], report
    assert report.deleted == [(str(tp), f"the source segment {victim} was deleted (retention or truncation)")]
    after = broker_files(pod.data)
    assert after.pop(f"{tp.dir_name}/{victim}.moved-away") == before.pop(f"{tp.dir_name}/{victim}")
    assert after == before
    assert stage.load(pdir) is None and stage.cleaned_to(pdir) is None


def test_a_source_segment_that_cannot_be_read(tmp_path: Path, make_log_dir) -> None:
    """The source's last batch is corrupt (same size): the commit cannot prove it unchanged."""
    pod, tp, pdir, s = staged(tmp_path, make_log_dir)
    src = s.sources[-1]
    path = pdir / src.name
    _corrupt_last_batch_magic(path)
    os.utime(path, ns=(src.mtime_ns, src.mtime_ns))
    reason = assert_refused(pod.data, tp, f"the source segment {src.name} cannot be read")
    assert "changed" not in reason


def _corrupt_last_batch_magic(path: Path) -> None:
    """Set the magic byte of the file's last batch to 9 (Kafka knows 0, 1 and 2)."""
    data = path.read_bytes()
    pos, last = 0, 0
    while pos + 17 <= len(data):
        last = pos
        pos += 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
    with open(path, "r+b") as f:
        f.seek(last + 16)
        f.write(b"\x09")


def test_a_source_segment_that_changed(tmp_path: Path, make_log_dir) -> None:
    pod, tp, pdir, s = staged(tmp_path, make_log_dir)
    src = s.sources[0]
    os.utime(pdir / src.name, ns=(src.mtime_ns + 10**9, src.mtime_ns + 10**9))
    assert_refused(pod.data, tp, f"the source segment {src.name} changed (mtime_ns)")


def test_the_high_watermark_went_back(tmp_path: Path, make_log_dir) -> None:
    pod, tp, _, s = staged(tmp_path, make_log_dir)
    checkpoint = OffsetCheckpointFile(pod.data / REPLICATION_OFFSET_CHECKPOINT)
    checkpoint.write({**checkpoint.read(), tp: s.high_watermark - 5})
    assert_refused(pod.data, tp, f"the high watermark went back from {s.high_watermark} to {s.high_watermark - 5}")


def test_a_high_watermark_no_longer_recorded(tmp_path: Path, make_log_dir) -> None:
    pod, tp, _, s = staged(tmp_path, make_log_dir)
    checkpoint = OffsetCheckpointFile(pod.data / REPLICATION_OFFSET_CHECKPOINT)
    checkpoint.write({k: v for k, v in checkpoint.read().items() if k != tp})
    assert_refused(pod.data, tp, f"the high watermark went back from {s.high_watermark} to None")


def test_a_leader_epoch_began_inside_the_staged_range(tmp_path: Path, make_log_dir) -> None:
    pod, tp, pdir, s = staged(tmp_path, make_log_dir)
    entries = [(e.epoch, e.start_offset) for e in read_leader_epoch_checkpoint(pdir)]
    entries.append((entries[-1][0] + 1, s.next_offset - 10))
    body = "".join(f"{e} {o}\n" for e, o in entries)
    (pdir / LEADER_EPOCH_CHECKPOINT).write_text(f"0\n{len(entries)}\n{body}")
    assert_refused(pod.data, tp, f"the leader epochs beginning below offset {s.next_offset} changed")


def test_the_broker_compacted_the_partition_itself(tmp_path: Path, make_log_dir) -> None:
    pod, tp, _, _ = staged(tmp_path, make_log_dir)
    OffsetCheckpointFile(pod.data / CLEANER_OFFSET_CHECKPOINT).write({tp: 100})
    assert_refused(pod.data, tp, "the broker compacted this partition itself", "cleaner-offset-checkpoint")


# -- validate alone --------------------------------------------------------------------------


def _validate_changes_nothing(pdir: Path, s: stage.StagedSet) -> str | None:
    before = broker_files(pdir.parent)
    reason = stage.validate(s, pdir)
    assert broker_files(pdir.parent) == before
    return reason


def test_an_unfinished_swap_in_the_partition_dir(tmp_path: Path, make_log_dir) -> None:
    """The broker's own cleaner is mid-swap (what ``stage status`` sees next to a running
    broker; the commit completes it first, as Kafka's start-up does)."""
    _, _, pdir, s = staged(tmp_path, make_log_dir)
    assert _validate_changes_nothing(pdir, s) is None
    busy = pdir / f"{s.sources[1].name}.cleaned"
    shutil.copyfile(pdir / s.sources[1].name, busy)
    reason = _validate_changes_nothing(pdir, s)
    assert reason is not None and f"unfinished swap ({busy.name})" in reason, reason


def test_a_directory_that_is_not_a_partition_dir(tmp_path: Path, make_log_dir) -> None:
    _, _, pdir, s = staged(tmp_path, make_log_dir)
    renamed = pdir.with_name("not_a_partition")
    pdir.rename(renamed)
    reason = _validate_changes_nothing(renamed, s)
    assert reason == "not_a_partition is not a partition directory", reason
