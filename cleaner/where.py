"""``kafka-cleaner where``: every record of one key still on a broker's disk, and when each goes.

Teams delete personal data from compacted topics with tombstones, and Kafka can say neither
where a key's old values still are nor when compaction will have removed them. This command
answers both for the log dirs it is given (one broker's disk; run it on every replica):

- it reads only the partition that can hold the key: Kafka's default partitioner over the
  topic's partition count, which ``__cluster_metadata`` on the same disk records (or
  ``--partition`` / ``--partitions`` when there is no metadata log);
- every segment of that partition, and a staged set of stage mode, is read a bounded chunk at
  a time (``iter_file_batches``); the compiled core digests every key (the offset map's
  xxh3-128) and only the records whose digest matches are compared byte for byte;
- each record found says when it will be gone, from the partition's cleaning picture (the
  same as ``status``: first dirty and first uncleanable offsets, eligibility) and the topic's
  effective configs: a superseded value at the next clean that covers it, a tombstone once its
  delete horizon has passed, the key's latest value never.

Read-only and lock-free: safe next to a live broker. Not modelled: records of aborted
transactions (the next clean removes them whatever their key) and a legacy (v0/v1) log's
tombstones, whose horizon is the segment's mtime.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from cleaner.commands import check_now_ms, clock_for, exit_codes_for_errors, load_policy_or_exit, log_dir_argument
from cleaner.config import Policy, parse_policy_text
from cleaner.engine.manager import LogCleanerManager, PartitionReport
from cleaner.engine.offset_map import digest_key, digest_keys
from cleaner.errors import KafkaCleanerError
from cleaner.output import Column, output_option, print_table, resolve_format
from cleaner.partitioner import partition_for_key
from cleaner.records.columns import decode_records
from cleaner.records.legacy import decode_legacy_entry
from cleaner.sidecar import stage
from cleaner.storage.cluster_metadata import find_metadata_dir, read_cluster_metadata
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.segment import iter_file_batches
from cleaner.storage.topic_partition import TopicPartition

EXIT_NOT_FOUND = 1

#: Without ``--policy``: every topic is read as compacted with Kafka's defaults; where a
#: metadata log is on the disk the cluster's own topic configs win (``effective_config``).
DEFAULT_POLICY = "topics:\n  - match: '.*'\n    cleanupPolicy: compact\n"


@dataclass(frozen=True)
class Found:
    """One record of the key in one file."""

    file: str
    offset: int
    timestamp_ms: int
    tombstone: bool
    delete_horizon_ms: int | None
    """The batch's delete horizon (KIP-534): set by the clean that first kept the tombstone."""


@dataclass(frozen=True)
class Sighting:
    """A record of the key still on disk, and when it will be gone."""

    log_dir: str
    topic: str
    partition: int
    file: str
    offset: int
    timestamp_ms: int
    kind: str
    """``value`` or ``tombstone``."""
    latest: bool
    """The key's last record in the partition's log (the value readers see)."""
    place: str
    """``segment``, ``active segment`` (the broker appends to it) or ``staged set``."""
    gone: str
    """When it will be gone, in words."""
    gone_by_ms: int | None
    """The earliest time it can be gone (None: never, or not before an event nobody schedules)."""


def find_in_file(path: Path, key: bytes) -> Iterator[Found]:
    """Every record of ``key`` in the segment file ``path``, in offset order."""
    wanted = digest_key(key)
    for batches in iter_file_batches(path, allow_truncated_tail=True):
        legacy = ~batches.is_v2
        for i in np.flatnonzero(legacy):
            yield from _find_legacy(batches, int(i), key, path)
        data_batches = batches.is_v2 & ~batches.is_control
        if not data_batches.any():
            continue
        selected = batches.select(data_batches)
        cols = decode_records(selected)
        rows = np.flatnonzero(cols.key_length == len(key))
        if not len(rows):
            continue
        starts, ends = cols.key_spans(rows)
        matched = (digest_keys(cols.data, starts, ends) == wanted).all(axis=1)
        rows, starts = rows[matched], starts[matched]
        if len(rows) and len(key):  # a digest collision is 2^-128, but say only what is there
            data = np.frombuffer(cols.data, dtype=np.uint8)
            same = (data[starts[:, None] + np.arange(len(key))] == np.frombuffer(key, dtype=np.uint8)).all(axis=1)
            rows = rows[same]
        batches_of = cols.batch[rows]
        horizons = np.where(selected.has_delete_horizon[batches_of],
                            selected.headers["base_timestamp"][batches_of], -1)
        for offset, timestamp, tombstone, horizon in zip(cols.offsets[rows].tolist(), cols.timestamps[rows].tolist(),
                                                         cols.is_tombstone[rows].tolist(), horizons.tolist(),
                                                         strict=True):
            yield Found(str(path), offset, timestamp, tombstone, None if horizon < 0 else horizon)


def _find_legacy(batches, i: int, key: bytes, path: Path) -> Iterator[Found]:  # type: ignore[no-untyped-def]
    entry = decode_legacy_entry(batches.entry_bytes(i))
    for record in entry.records():
        if record.key == key:
            yield Found(str(path), record.offset, record.timestamp, record.value is None, None)


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def gone_when(found: Found, *, latest: bool, place: str, report: PartitionReport, delete_retention_ms: int,
              max_compaction_lag_ms: int, now_ms: int) -> tuple[str, int | None]:
    """When ``found`` will be gone: words, and the earliest time if the configs fix one."""
    if place == "staged set":
        return "with the staged set: at its commit (which replaces the segments it cleaned) or discard", None
    if not report.compacted:
        return "never by compaction: the topic is not compacted (retention may delete its segment)", None
    if latest and not found.tombstone:
        return "stays: the key's latest value (a tombstone for the key would delete it)", None
    cleanable = found.offset < report.first_uncleanable_offset
    if not cleanable:
        holder = {"activeSegment": "the active segment rolls (segment.ms or segment.bytes)",
                  "lso": "the open transaction holding the last stable offset ends"}
        waits = holder.get(report.reason or "", "its segment becomes cleanable")
        then = "then its delete horizon passes" if found.tombstone else "then a clean covers it"
        return f"not before {waits}; {then}", None
    if found.tombstone:
        if found.delete_horizon_ms is None:
            return (f"at its first clean a delete horizon {delete_retention_ms} ms later is stamped "
                    "(delete.retention.ms); gone at a clean after that"), None
        if found.delete_horizon_ms > now_ms:
            return f"at the first clean after its delete horizon, {_iso(found.delete_horizon_ms)}", \
                found.delete_horizon_ms
        return _next_clean(report, max_compaction_lag_ms)
    return _next_clean(report, max_compaction_lag_ms)


def _next_clean(report: PartitionReport, max_compaction_lag_ms: int) -> tuple[str, int | None]:
    if report.eligible:
        return "at the next clean: the partition is eligible now", None
    deadline = None
    if report.earliest_dirty_timestamp_ms is not None and max_compaction_lag_ms < 2**62:
        deadline = report.earliest_dirty_timestamp_ms + max_compaction_lag_ms
    why = {"ratio": f"its dirty ratio {report.cleanable_ratio:.2f} reaches {report.min_cleanable_ratio}",
           "lag": "min.compaction.lag.ms has passed", "paused": "cleaning is resumed",
           "uncleanable": f"the damage is repaired ({report.uncleanable_reason})"}.get(report.reason or "",
                                                                                    f"it is eligible ({report.reason})")
    text = f"at the next clean once {why}"
    if deadline is not None:
        text += f"; by max.compaction.lag.ms, eligible at {_iso(deadline)}"
    return text, deadline


def where(paths: Sequence[Path], policy: Policy, key: bytes, topic: str, now_ms: int, *,
          partition: int | None = None, partitions: int | None = None) -> tuple[list[Sighting], list[str]]:
    """Every record of ``key`` in ``topic`` on the log dirs ``paths``, and notes for a person
    (which partition was read and why, what could not be read)."""
    notes: list[str] = []
    if partition is None:
        count = partitions
        metadata_dir = find_metadata_dir([Path(p) for p in paths])
        if count is None and metadata_dir is not None:
            count = read_cluster_metadata(metadata_dir).partition_count(topic)
        if count is None:
            raise click.UsageError(f"the partition count of {topic!r} is unknown (no __cluster_metadata-0 on these "
                                   "log dirs knows the topic): give --partitions N or --partition P")
        partition = partition_for_key(key, count)
        notes.append(f"key -> partition {partition} of {count} (Kafka's default partitioner)")
    tp = TopicPartition(topic, partition)
    time = clock_for(now_ms)
    log_dirs = [LogDirectory(p, read_only=True) for p in paths]
    manager = LogCleanerManager(log_dirs, policy, time, write_checkpoints=False, only=lambda t: t == tp)
    reports = {r.topic_partition: r for r in manager.report(now_ms)}
    logs = manager.logs()
    if tp not in logs:
        notes.append(f"{tp} is not on these log dirs: this broker holds no replica of it")
        return [], notes
    managed, report = logs[tp], reports[tp]
    segments = managed.log.segments
    files: list[tuple[Path, str]] = [(s.log_path, "segment") for s in segments[:-1]]
    files += [(s.log_path, "active segment") for s in segments[-1:]]
    staged = stage.load(managed.log.dir)
    if staged is not None:
        set_dir = stage.set_dir(managed.log.dir)
        files += [(set_dir / name, "staged set") for name in sorted(staged.files)
                  if name.endswith((".log", ".log.cleaned"))]
    found: list[tuple[Found, str]] = []
    for path, place in files:
        try:
            found += [(f, place) for f in find_in_file(path, key)]
        except (KafkaCleanerError, OSError) as e:  # a segment deleted or rolled under the read
            notes.append(f"{path}: not read ({e})")
    in_log = [f.offset for f, place in found if place != "staged set"]
    latest = max(in_log, default=None)
    sightings = []
    for f, place in found:
        is_latest = place != "staged set" and f.offset == latest
        gone, by = gone_when(f, latest=is_latest, place=place, report=report,
                             delete_retention_ms=managed.rule.delete_retention_ms,
                             max_compaction_lag_ms=managed.rule.max_compaction_lag_ms, now_ms=now_ms)
        sightings.append(Sighting(str(report.log_dir), topic, partition, f.file, f.offset, f.timestamp_ms,
                                  "tombstone" if f.tombstone else "value", is_latest, place, gone, by))
    return sightings, notes


def summary(sightings: list[Sighting]) -> str:
    """One line for a person on call: a hot key can have thousands of rows, and what matters
    first is how many records of it are still on disk and how many of those are waiting on
    the active segment's roll, which no clean can hurry."""
    values = sum(1 for s in sightings if s.kind == "value" and not s.latest)
    tombstones = sum(1 for s in sightings if s.kind == "tombstone" and not s.latest)
    latest = next((s.kind for s in sightings if s.latest), None)
    parts = [f"{len(sightings):,} record(s) of the key"]
    parts.append(f"the latest a {latest}" if latest else "none of them the latest in the log")
    parts.append(f"{values:,} older value(s), {tombstones:,} older tombstone(s)")
    by_place = {place: sum(1 for s in sightings if s.place == place) for place in ("active segment", "staged set")}
    parts += [f"{n:,} in the {place}" for place, n in by_place.items() if n]
    return "; ".join(parts)


def print_sightings(fmt: str, sightings: Sequence[Sighting], brokers: Sequence[str] | None = None) -> None:
    """The table of ``where`` (``fmt``: table, wide or tsv); ``brokers``: a first column naming
    the broker of each row (the operator's ``where`` over every replica)."""
    columns = [Column("partition"), Column("file", drop=2), Column("offset", right=True),
               Column("timestamp", drop=1), Column("kind"), Column("latest"), Column("where", drop=3),
               Column("gone")]
    rows: list[list[Any]] = [[f"{s.topic}-{s.partition}", s.file, s.offset, _iso(s.timestamp_ms), s.kind,
                              "yes" if s.latest else "no", s.place, s.gone] for s in sightings]
    if brokers is not None:
        columns.insert(0, Column("broker"))
        rows = [[broker, *row] for broker, row in zip(brokers, rows, strict=True)]
    print_table(fmt, "where", columns, rows)


def key_from(key: str | None, key_hex: str | None, key_file: Path | None) -> bytes:
    """The key of ``--key``, ``--key-hex`` or ``--key-file`` (exactly one of them)."""
    given = [v for v in (key, key_hex, key_file) if v is not None]
    if len(given) != 1:
        raise click.UsageError("give the key once: --key TEXT, --key-hex HEX or --key-file FILE")
    if key is not None:
        return key.encode()
    if key_hex is not None:
        try:
            return bytes.fromhex(re.sub(r"\s+", "", key_hex))
        except ValueError as e:
            raise click.BadParameter(f"not hexadecimal: {e}", param_hint="--key-hex") from None
    assert key_file is not None
    return key_file.read_bytes()


def question_options(f):  # type: ignore[no-untyped-def]
    """``--topic``, the key (``--key``, ``--key-hex``, ``--key-file``) and ``--partition`` /
    ``--partitions``: the question, here and in the operator's ``where``."""
    for option in reversed([
        click.option("--topic", required=True, help="The topic's exact name (not a regular expression)."),
        click.option("--key", default=None, help="The key as UTF-8 text."),
        click.option("--key-hex", default=None, help="The key as hexadecimal bytes."),
        click.option("--key-file", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="The key: the file's bytes, all of them."),
        click.option("--partition", type=click.IntRange(min=0), default=None,
                     help="Read this partition instead of the one Kafka's default partitioner picks."),
        click.option("--partitions", type=click.IntRange(min=1), default=None,
                     help="The topic's partition count, where no __cluster_metadata-0 on the disk knows it."),
    ]):
        f = option(f)
    return f


@click.command("where")
@log_dir_argument
@question_options
@click.option("--policy", "policy_path", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Policy file for the topic's configs (default: compacted, Kafka's defaults; the cluster's "
              "own topic configs win where the metadata log is on the disk).")
@click.option("--now-ms", type=int, default=None, callback=check_now_ms, help="Pin the clock (epoch ms).")
@output_option
def where_command(data_dir: tuple[Path, ...], topic: str, key: str | None, key_hex: str | None,
                  key_file: Path | None, partition: int | None, partitions: int | None, policy_path: Path | None,
                  now_ms: int | None, output: str | None, as_json: bool) -> None:
    """Every record of one key still on these log dirs (value or tombstone), with its file,
    offset and timestamp, whether it is the key's latest, in the active segment or in a staged
    set, and when it will be gone under the topic's configs. Reads only the partition that can
    hold the key; read-only, safe next to a live broker. Exit 0 when records were found, 1 when
    none is on these dirs (run it on every replica)."""
    key_bytes = key_from(key, key_hex, key_file)
    policy = load_policy_or_exit(policy_path) if policy_path else parse_policy_text(DEFAULT_POLICY)
    now = clock_for(now_ms).milliseconds()
    with exit_codes_for_errors():
        sightings, notes = where(data_dir, policy, key_bytes, topic, now, partition=partition, partitions=partitions)
    fmt = resolve_format(output, as_json)
    for note in notes:
        click.echo(f"where: {note}", err=True)
    if fmt == "json":
        click.echo(json.dumps([asdict(s) for s in sightings], indent=2))
    elif sightings:
        print_sightings(fmt, sightings)
        click.echo(f"where: {summary(sightings)}", err=True)
    if not sightings:
        click.echo(f"where: no record of the key in {topic} on {', '.join(map(str, data_dir))}", err=True)
        sys.exit(EXIT_NOT_FOUND)
