"""A fleet's log dir copied to S3-compatible object storage (a real server, ``tests/object_store``),
reported and compacted from there by the Spark jobs: the same rows as the report of the log dir
on disk, the same bytes as ``kafka-cleaner clean``, and a driver that lists objects but reads
none of a partition's (``cleaner.spark.object_store``); and compacted into object storage,
marked whole by ``_SUCCESS`` only once it is (``cleaner.spark.object_output``)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest
from spark_helpers import LARGE_TP, NOW, assert_same_partitions, checkpoint, compacted, set_high_watermark

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.errors import CorruptRecordError, KafkaCleanerError
from cleaner.generate import GeneratorConfig, generate
from cleaner.spark import object_store as objects
from cleaner.spark.cli import OutputLocation
from cleaner.spark.compact import compact
from cleaner.spark.compact_large import compact_large
from cleaner.spark.object_output import SUCCESS, read_success
from cleaner.spark.object_store import ObjectInfo, ObjectLogDir, mirror
from cleaner.spark.plan import partition_of_input
from cleaner.spark.report import report
from cleaner.spark.staging import InjectedFault
from cleaner.storage.log import Log
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.segment import DEFAULT_INDEX_INTERVAL_BYTES

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]


@pytest.fixture(scope="module")
def s3(object_store, spark):
    """This process and the session's Python workers pointed at the store; a bucket of the
    module's own."""
    workers = spark.sparkContext.environment
    saved = dict(workers)
    with pytest.MonkeyPatch.context() as env:
        for name in objects.CLIENT_ENV:
            env.delenv(name, raising=False)
        for name, value in object_store.env().items():
            env.setenv(name, value)
        workers.update(object_store.env())
        bucket = f"fleet-{uuid.uuid4().hex[:8]}"
        object_store.client().create_bucket(Bucket=bucket)
        yield bucket
    workers.clear()
    workers.update(saved)


@pytest.fixture(scope="module")
def fleet_in_s3(s3, fleet, object_store) -> str:
    """``fleet`` copied to the bucket as rclone copies a log dir (each file's mtime kept in
    its metadata). Read-only."""
    uri = f"s3://{s3}/brokers/b1/data"
    object_store.upload_log_dir(fleet, uri)
    return uri


def _driver_downloads(monkeypatch) -> list[str]:
    """The objects this process (the driver: tasks run in Python workers) reads."""
    read: list[str] = []
    real = objects.download

    def recorded(log_dir: ObjectLogDir, o: ObjectInfo, path: Path) -> None:
        read.append(o.name)
        real(log_dir, o, path)

    monkeypatch.setattr(objects, "download", recorded)
    return read


def test_report_from_object_storage_is_the_report_of_the_log_dir(spark, fleet_report, fleet_policy, fleet_in_s3,
                                                                  monkeypatch):
    read = _driver_downloads(monkeypatch)
    rows, outcome, _ = report(spark, [fleet_in_s3], fleet_policy, now_ms=NOW)
    assert read == []  # the driver listed the log dir and read none of its objects
    local = fleet_report
    assert len(rows) == len(local) == 10
    for remote, here in zip(rows, local, strict=True):
        assert remote["logDir"] == remote["sourceRoot"] == fleet_in_s3
        assert {k: v for k, v in remote.items() if k not in ("logDir", "sourceRoot")} == {
            k: v for k, v in here.items() if k not in ("logDir", "sourceRoot")
        }
    assert sum(r["reclaimableBytes"] or 0 for r in rows) > 0
    assert sum(outcome.distinct_keys.values()) > 0


def test_compact_from_object_storage_is_byte_identical_to_clean(
    spark, tmp_path, fleet, fleet_cleaned, fleet_policy, fleet_in_s3, monkeypatch
):
    read = _driver_downloads(monkeypatch)
    out = tmp_path / "out"
    result = compact(spark, [fleet_in_s3.replace("s3://", "s3a://")], fleet_policy, output=out, now_ms=NOW)
    assert result.status == "committed"
    tps = compacted(fleet, fleet_policy)
    assert_same_partitions(fleet_cleaned, out / "data", tps)
    assert checkpoint(out / "data") == checkpoint(fleet_cleaned)
    # The driver read the log dir's root files for the output's, and no partition's object.
    assert read and all("/" not in name for name in read), read
    assert {r["sourceRoot"] for r in result.rows()} == {fleet_in_s3.replace("s3://", "s3a://")}

    # The same listing is the same plan: a rerun commits nothing again.
    again = compact(spark, [fleet_in_s3], fleet_policy, output=out, now_ms=NOW)
    assert again.status == "already-committed" and again.run_id == result.run_id


def test_object_storage_is_never_cleaned_in_place(spark, fleet_policy, fleet_in_s3):
    with pytest.raises(KafkaCleanerError, match="copy-on-write: give --output"):
        compact(spark, [fleet_in_s3], fleet_policy, now_ms=NOW)


def test_a_mirror_has_the_files_their_times_and_refuses_an_object_changed_since_the_listing(
    s3, fleet, tmp_path, object_store
):
    partition = "topic-1-0"
    one = tmp_path / "one" / "data"  # the fleet's root files and one partition
    shutil.copytree(fleet, one, ignore=lambda d, names: [n for n in names if Path(d) == fleet
                                                          and (fleet / n).is_dir() and n != partition])
    log_dir = ObjectLogDir.parse(f"s3://{s3}/one/data")
    object_store.upload_log_dir(one, log_dir.uri)
    assert sorted(log_dir.layout()[1]) == [partition]
    local = mirror(log_dir, partition, base=tmp_path / "mirrors")
    for src in sorted((fleet / partition).iterdir()):
        copy = local / partition / src.name
        assert copy.read_bytes() == src.read_bytes()
        assert copy.stat().st_mtime_ns == src.stat().st_mtime_ns, src.name  # rclone's mtime metadata, exactly
    assert mirror(log_dir, partition, base=tmp_path / "mirrors") == local  # made once per listing
    with pytest.raises(KafkaCleanerError, match="no such partition"):
        mirror(log_dir, "nothing-0", base=tmp_path / "mirrors")

    # The object rewritten between the listing and the read: the task fails, naming it.
    (listed,) = [o for o in log_dir.listing(partition + "/") if o.name.endswith(".log")][:1]
    object_store.client().put_object(Bucket=s3, Key=log_dir.key(listed.name), Body=b"rewritten")
    with pytest.raises(KafkaCleanerError, match=f"{listed.name}: the object changed since it was listed"):
        objects.download(log_dir, listed, tmp_path / "x.log")
    # And the next listing is another mirror, of what is there now.
    assert mirror(log_dir, partition, base=tmp_path / "mirrors") != local
    assert not any(p.name.startswith(".") for p in (tmp_path / "mirrors").iterdir())  # no half-made mirror


def test_an_object_storage_input_names_its_bucket_and_prefix():
    assert ObjectLogDir.parse("s3a://bucket/a/b/").uri == "s3://bucket/a/b"
    for bad in ("s3://bucket", "s3://bucket/", "s3:///prefix"):
        with pytest.raises(KafkaCleanerError, match="s3://<bucket>/<prefix>"):
            ObjectLogDir.parse(bad)
    # compact-large's PARTITION_DIR: a partition of a log dir with a prefix of its own.
    for bad in ("s3://bucket/topic-0", "s3://bucket/data/not-a-partition", "s3://bucket/data/"):
        with pytest.raises(KafkaCleanerError, match="s3://<bucket>/<prefix>/<topic>-<partition>"):
            partition_of_input(bad)


def test_compact_into_object_storage_is_byte_identical_and_marked_whole_last(
    spark, tmp_path, fleet, fleet_cleaned, fleet_policy, fleet_in_s3, s3, object_store
):
    out = ObjectLogDir.parse(f"s3://{s3}/cleaned/{uuid.uuid4().hex[:8]}")
    client, staging = object_store.client(), tmp_path / "staging"
    tps = compacted(fleet, fleet_policy)
    # An earlier output there: a segment the new one does not have, and that output's _SUCCESS.
    stale = f"data/{tps[0].dir_name}/00000000000099999999.log"
    client.put_object(Bucket=s3, Key=out.key(stale), Body=b"an older output's segment")
    client.put_object(Bucket=s3, Key=out.key(SUCCESS), Body=b'{"runId": "an older run"}')

    # Killed after every partition was uploaded, before the commit: not marked whole.
    with pytest.raises(InjectedFault):
        compact(spark, [fleet_in_s3], fleet_policy, output=out.uri, staging=staging, now_ms=NOW,
                faults={"fail": "before-commit"})  # fmt: skip
    assert read_success(out) is None
    assert not [o for o in out.listing() if o.name == stale]  # each partition's prefix holds its directory

    result = compact(spark, [fleet_in_s3], fleet_policy, output=out.uri, staging=staging, now_ms=NOW)
    assert result.status == "committed"
    assert "job" not in result.seconds  # the manifest was there: only the commit ran
    local = object_store.download_log_dir(f"{out.uri}/data", tmp_path / "fetched" / "data")
    assert_same_partitions(fleet_cleaned, local, tps)
    assert checkpoint(local) == checkpoint(fleet_cleaned)
    assert set(LogDirectory(local).partition_dirs()) == set(tps)  # the ineligible ones copied, as on a disk
    success = read_success(out)
    assert success is not None and success["runId"] == result.run_id
    listed = ObjectLogDir.parse(f"{out.uri}/data").listing()
    assert success["objects"][f"{out.uri}/data"]["objects"] == [[o.name, o.size, o.etag] for o in listed]

    again = compact(spark, [fleet_in_s3], fleet_policy, output=out.uri, staging=staging, now_ms=NOW)
    assert again.status == "already-committed" and again.run_id == result.run_id

    # The output changed since (an object removed): not the commit's any more, cleaned again.
    victim = next(o for o in listed if o.name.startswith(f"{tps[0].dir_name}/") and o.name.endswith(".log"))
    client.delete_object(Bucket=s3, Key=out.key(f"data/{victim.name}"))
    third = compact(spark, [fleet_in_s3], fleet_policy, output=out.uri, staging=staging, now_ms=NOW)
    assert third.status == "committed" and third.run_id == result.run_id
    fetched = object_store.download_log_dir(f"{out.uri}/data", tmp_path / "fetched-again" / "data")
    assert_same_partitions(fleet_cleaned, fetched, tps)
    assert read_success(out)["runId"] == result.run_id


def test_an_output_in_object_storage_is_named_clearly(tmp_path, fleet_policy):
    assert OutputLocation().convert("s3a://bucket/cleaned", None, None) == "s3a://bucket/cleaned"
    assert OutputLocation().convert(str(tmp_path / "out"), None, None) == tmp_path / "out"
    with pytest.raises(KafkaCleanerError, match="object storage needs --staging"):
        compact(None, ["s3://bucket/in/data"], fleet_policy, output="s3://bucket/out")
    with pytest.raises(KafkaCleanerError, match="must be outside the input log dir s3://bucket/in/data"):
        compact(None, ["s3://bucket/in/data"], fleet_policy, output="s3://bucket/in", staging=tmp_path)


@pytest.fixture(scope="module")
def large_in_s3(s3, large, object_store) -> str:
    """``large`` (one partition of dozens of gzip segments) copied to the bucket. Read-only."""
    uri = f"s3://{s3}/large/data"
    object_store.upload_log_dir(large, uri)
    return uri


def _driver_log_ranges(monkeypatch) -> dict[str, int]:
    """Bytes of each ``.log`` object this process (the driver) fetches, whole or by range."""
    fetched: dict[str, int] = {}
    real = objects._get

    def recorded(log_dir, o, f, start, end):
        if o.name.endswith(".log"):
            fetched[o.name] = fetched.get(o.name, 0) + end - start
        return real(log_dir, o, f, start, end)

    monkeypatch.setattr(objects, "_get", recorded)
    return fetched


@pytest.fixture(scope="module")
def small_batches(tmp_path_factory, large_policy) -> tuple[Path, Path]:
    """(a log dir of one partition of 64 KiB segments of ~1 KiB lz4 batches, transactions among
    them, its high watermark at half the log; the same after ``kafka-cleaner clean``)."""
    root = tmp_path_factory.mktemp("small-batches") / "data"
    generate(root, GeneratorConfig(topics=1, partitions=1, records=30_000, keys=3_000, tombstones=0.1,
                                   compression="lz4", transactions=0.3, segment_bytes=64 * 1024, batch_bytes=1024,
                                   topic_prefix="big", now_ms=NOW, seed=12))
    set_high_watermark(root, LARGE_TP, Log.open(root / LARGE_TP.dir_name, read_only=True).log_end_offset // 2)
    cleaned = tmp_path_factory.mktemp("small-batches-cleaned") / "data"
    shutil.copytree(root, cleaned)
    cleaning.clean([cleaned], large_policy, FixedTime(NOW))
    return root, cleaned


def test_compact_large_from_object_storage_is_byte_identical_and_its_driver_reads_heads_and_tails(
    spark, tmp_path, small_batches, large_policy, s3, object_store, monkeypatch
):
    source, expected = small_batches
    uri = f"s3://{s3}/small-batches/data"
    object_store.upload_log_dir(source, uri)
    fetched = _driver_log_ranges(monkeypatch)
    out = tmp_path / "out"
    done = compact_large(spark, f"{uri}/{LARGE_TP.dir_name}", large_policy, output=out, now_ms=NOW)
    assert done.status == "committed" and len(done.groups) >= 3
    assert_same_partitions(expected, out, [LARGE_TP])
    assert checkpoint(out) == checkpoint(expected) == {LARGE_TP: done.end_offset}

    # The driver planned on each segment's first batch and its tail from its last offset index
    # entry (at most index.interval.bytes and a batch before its end); the active segment's
    # tail is where the producers are replayed from their newest snapshot.
    segments = Log.open(source / LARGE_TP.dir_name, read_only=True).segments
    largest_batch = max(int(b.sizes.max()) for s in segments for b in s.iter_batches())
    bound = DEFAULT_INDEX_INTERVAL_BYTES + 2 * largest_batch
    sizes = {f"{LARGE_TP.dir_name}/{s.log_path.name}": s.size for s in segments}
    assert len(sizes) >= 20 and set(fetched) <= set(sizes)
    over = {name: n for name, n in fetched.items() if n > bound and name != max(sizes)}
    assert not over, (bound, over)
    assert sum(fetched.values()) < sum(sizes.values()) / 5, (sum(fetched.values()), sum(sizes.values()))

    # The executors' mirrors are hollow too: they hold whole the segments their tasks read (the
    # round's, below the high watermark), not the partition.
    (base,) = set(spark.sparkContext.parallelize(range(4), 4).map(lambda _: str(objects.mirror_base())).collect())
    states = [json.loads(p.read_text()) for p in Path(base).glob(f"*/{objects.HOLLOW_STATE}")]
    states = [st for st in states if st["uri"] == uri]
    assert states, f"no hollow mirror of {uri} under {base}"
    whole = {name for st in states for name, w in st["windows"].items() if w == [[0, st["objects"][name][0]]]}
    above = [n for n in sizes if int(n.rsplit("/", 1)[1][:20]) >= done.end_offset]
    assert whole and not whole & set(above) and len(whole) < len(sizes), (len(whole), len(sizes))

    # The same listing is the same plan: a rerun commits nothing again.
    again = compact_large(spark, f"{uri}/{LARGE_TP.dir_name}", large_policy, output=out, now_ms=NOW)
    assert again.status == "already-committed" and again.run_id == done.run_id
    with pytest.raises(KafkaCleanerError, match="never cleaned in place"):
        compact_large(spark, f"{uri}/{LARGE_TP.dir_name}", large_policy, now_ms=NOW)


def test_a_plan_that_needs_more_than_the_hollow_mirror_holds_says_so(spark, tmp_path, large, large_policy, s3,
                                                                      object_store):
    """The newest producer snapshot unreadable: the engine replays from an older one, over
    bytes the driver did not download. A clear error, no output."""
    uri = f"s3://{s3}/bad-snapshot/data"
    object_store.upload_log_dir(large, uri)
    newest = max(p.name for p in (large / LARGE_TP.dir_name).glob("*.snapshot"))
    object_store.client().put_object(Bucket=s3, Key=ObjectLogDir.parse(uri).key(f"{LARGE_TP.dir_name}/{newest}"),
                                     Body=b"not a snapshot")
    with pytest.raises(KafkaCleanerError, match=r"which the driver does not download \(it reads each segment's head"):
        compact_large(spark, f"{uri}/{LARGE_TP.dir_name}", large_policy, output=tmp_path / "out", now_ms=NOW)
    assert not (tmp_path / "out" / LARGE_TP.dir_name).exists()


def test_a_hollow_mirror_is_the_partitions_size_and_times_and_a_read_past_what_it_holds_fails(
    large, large_in_s3, tmp_path
):
    """What the driver of compact-large plans on (``object_store``'s docstring)."""
    log_dir = ObjectLogDir.parse(large_in_s3)
    local = mirror(log_dir, LARGE_TP.dir_name, base=tmp_path / "mirrors", hollow=True) / LARGE_TP.dir_name
    source = large / LARGE_TP.dir_name
    assert sorted(p.name for p in local.iterdir()) == sorted(p.name for p in source.iterdir())
    for src in source.iterdir():
        copy = local / src.name
        assert (copy.stat().st_size, copy.stat().st_mtime_ns) == (src.stat().st_size, src.stat().st_mtime_ns)
        if not src.name.endswith(".log"):
            assert copy.read_bytes() == src.read_bytes()
    hollow = Log.open(local, read_only=True)
    full = Log.open(source, read_only=True)
    assert hollow.log_end_offset == full.log_end_offset
    assert [s.first_batch_timestamp() for s in hollow.segments] == [s.first_batch_timestamp() for s in full.segments]
    # A reader of every batch reads what the segment holds, or meets a hole where an entry would
    # start and raises: never fewer batches, never other ones.
    holes = 0
    for segment, whole in zip(hollow.segments, full.segments, strict=True):
        expected = [entry for b in whole.iter_batches() for entry in _entries(b)]
        read: list[tuple[int, int, int]] = []
        try:
            for b in segment.iter_batches():
                read.extend(_entries(b))
        except CorruptRecordError as error:
            assert objects.in_hole(error.path, error.position) and not objects.in_hole(error.path, error.position - 1)
            assert error.position in {p for p, _, _ in expected}  # where an entry starts
            holes += 1
        else:
            assert read == expected
        assert [segment.read(p, n) for p, _, n in read] == [whole.read(p, n) for p, _, n in read]  # whole entries
    assert holes >= 15

    # A task's segments filled in: whole, the same bytes and time; the others still hollow.
    some = [s.base_offset for s in full.segments[3:6]]
    objects.fill(local, some)
    for segment, whole in zip(hollow.segments, full.segments, strict=True):
        name = whole.log_path.name
        if segment.base_offset in some:
            assert (local / name).read_bytes() == whole.log_path.read_bytes()
            assert (local / name).stat().st_mtime_ns == whole.log_path.stat().st_mtime_ns
            assert not objects.in_hole(local / name, whole.size // 2)
    other = next(w for w in full.segments[6:] if int(w.first_batch().sizes[0]) < w.lookup_position(2**63 - 1))
    assert objects.in_hole(local / other.log_path.name, int(other.first_batch().sizes[0]))



def test_two_tasks_making_the_same_hollow_mirror_keep_what_the_first_filled(large, large_in_s3, tmp_path,
                                                                            monkeypatch):
    """Task B builds the mirror while task A builds the same one, renames it into place and
    fills a segment: B's rename loses, and what A filled stays recorded as whole (B's record
    of the mirror went with B's copy, not over A's)."""
    log_dir, base = ObjectLogDir.parse(large_in_s3), tmp_path / "mirrors"
    holey = next(w for w in Log.open(large / LARGE_TP.dir_name, read_only=True).segments
                 if int(w.first_batch().sizes[0]) < w.lookup_position(2**63 - 1))
    segment, middle = holey.log_path, int(holey.first_batch().sizes[0])  # a hole in a hollow mirror
    real, calls = objects._hollow_logs, []

    def building(*args):
        calls.append(1)
        if len(calls) == 1:  # B, part-way: A makes the whole mirror and fills a segment
            a = mirror(log_dir, LARGE_TP.dir_name, base=base, hollow=True)
            objects.fill(a / LARGE_TP.dir_name, [int(segment.name[:20])])
        return real(*args)

    monkeypatch.setattr(objects, "_hollow_logs", building)
    b = mirror(log_dir, LARGE_TP.dir_name, base=base, hollow=True)
    assert len(calls) == 2
    filled = b / LARGE_TP.dir_name / segment.name
    assert filled.read_bytes() == segment.read_bytes()
    assert not objects.in_hole(filled, middle)


def _entries(batches) -> list[tuple[int, int, int]]:
    """(file position, base offset, size) of each batch."""
    return list(zip(batches.file_positions.tolist(), batches.base_offsets.tolist(), batches.sizes.tolist(),
                    strict=True))
