"""Test helpers: write partition directories from records, and read a directory back the
way a Kafka broker would after its start-up (KAFKA_NOTES §4), without changing it.

``broker_view`` is the oracle of the crash-safety tests: it applies Kafka's start-up
rules to a *copy* of the directory and returns every record a consumer would read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from cleaner.records.builder import build_batch
from cleaner.records.columns import decode_records
from cleaner.records.compression import CompressionType
from cleaner.records.record import Record
from cleaner.storage.log import Log, LogConfig


def batch_of(
    offsets: Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None] | None = None,
    *,
    timestamp: int = 1_000,
    compression: int = CompressionType.NONE,
    **kwargs,
) -> bytes:
    values = values if values is not None else [b"v%d" % o for o in offsets]
    records = [Record(o, timestamp + o, k, v) for o, k, v in zip(offsets, keys, values, strict=True)]
    return build_batch(records, compression=compression, **kwargs)


def write_log(
    directory: str | os.PathLike[str],
    batches: Iterable[bytes],
    *,
    config: LogConfig | None = None,
    roll_every: int | None = None,
) -> Log:
    """A partition directory holding ``batches`` (rolled by ``config.segment_bytes``, or
    every ``roll_every`` batches), closed like a broker at shutdown."""
    log = Log.create(directory, config or LogConfig())
    for i, batch in enumerate(batches):
        if roll_every and i and i % roll_every == 0:
            log.roll()
        log.append(batch)
    log.close()
    return Log.open(directory, config or LogConfig())


def read_records(log: Log) -> list[Record]:
    out: list[Record] = []
    for chunk in log.iter_batches(0):
        v2 = chunk.select(chunk.is_v2)
        if len(v2):
            out.extend(decode_records(v2).records())
        for entry in chunk.legacy.values():
            out.extend(entry.records())
    return sorted(out, key=lambda r: r.offset)


def broker_view(directory: str | os.PathLike[str], config: LogConfig | None = None) -> list[Record]:
    """Records a broker would serve after its start-up, computed on a copy."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / Path(directory).name
        shutil.copytree(directory, copy)
        log = Log.open(copy, config)
        try:
            return read_records(log)
        finally:
            log.close()


def latest_by_key(records: Iterable[Record]) -> dict[bytes | None, Record]:
    latest: dict[bytes | None, Record] = {}
    for r in records:
        latest[r.key] = r
    return latest


def snapshot_dir(directory: str | os.PathLike[str]) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime, to prove that something changed nothing."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            p = Path(root) / name
            out[str(p.relative_to(directory))] = (p.read_bytes(), p.stat().st_mtime_ns)
    return out
