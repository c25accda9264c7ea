"""Throughput of the record-format layer (``cleaner.records``), measured in one run.

For 100-byte and 1 KiB records (key + value), uncompressed and per codec, on producer-shaped
batches (~16 KiB each: Kafka's default ``batch.size``; for a codec, ~16 KiB *compressed*, as the
Java producer fills batches by estimated compressed size), this prints one row per operation:

- read           the whole log file read from the page cache into memory (a buffer of the
                 file's size, touched beforehand): the reference of the issue's targets;
- read 1MiB buf  the same file through one reused 1 MiB buffer, as the cleaner's read loop
                 reads (the destination stays in the CPU cache, so this is faster);
- scan           header-only: ``scan_batches`` + ``Batches.verify_checksums`` per 1 MiB chunk;
- crc32c alone   ``crc32c.crc32c`` over every batch's CRC-covered bytes: the floor of ``scan``;
- decode         ``scan_batches`` + ``verify_checksums`` + ``decode_records`` per 1 MiB chunk;
- decode 4MiB    the same per 4 MiB chunk (what ``cleaner.engine`` reads at least);
- build          ``build_batch`` from ``Record`` objects (the whole log, batch by batch);
- rebuild 1/2    ``rebuild_batches`` of every decoded 1 MiB chunk keeping a random ~half of each
                 batch's records (at least one), one call per chunk as the cleaner does;
- rebuild_batch 1/2  the same work, one ``rebuild_batch`` call per batch;
- codec -d/-c    the codec alone: ``compression.decompress`` of every records section and
                 ``compression.compress`` of the same decompressed sections.

MB/s counts log bytes (on disk: compressed sections for a codec) read by read/scan/decode/
crc32c/codec -d, and log bytes written by build/rebuild/codec -c. ``vs read`` and ``vs buf``
divide an operation's MB/s by the two reads' MB/s of the same bytes; ``lib share`` is the share
of an operation's time that the C library alone takes for the same work (crc32c for scan, the
codec for decode and build). Every figure is the best of ``--repeat`` interleaved rounds (the
reads: of at least 5). See bench/README.md. Run: ``.venv/bin/python bench/format.py [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib.metadata
import os
import platform
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c
import numpy as np

from cleaner import _native
from cleaner.records.builder import build_batch, rebuild_batch, rebuild_batches
from cleaner.records.columns import RecordColumns, decode_records
from cleaner.records.compression import CompressionType, compress, decompress
from cleaner.records.record import Record
from cleaner.records.scan import Batches, scan_batches

MiB = 1 << 20
CHUNK = MiB  # a read buffer of Kafka's default size (log.cleaner.io.buffer.size is 512 KiB per direction)
BIG_CHUNK = 4 * MiB  # what cleaner.engine reads at least (MIN_READ_CHUNK): decoding has a fixed cost per chunk
PRODUCER_BATCH = 16 * 1024  # Kafka's default batch.size
KEY_SIZE = 13  # b"user-00000000"
RECORD_OVERHEAD = 8  # length, attributes, deltas, key/value lengths, header count, for these sizes
TOMBSTONE_EVERY = 50  # ~2% tombstones
SCAN_TARGET = 0.5  # header-only scan vs plain read
DECODE_TARGET = 2e6  # records/s, uncompressed 100-byte records

DEFAULT_MIB = {"none": 64, "lz4": 32, "snappy": 32, "zstd": 32, "gzip": 16}
QUICK_MIB = {"none": 8, "lz4": 4, "snappy": 4, "zstd": 4, "gzip": 2}


# ---- data ------------------------------------------------------------------------------------


def text_corpus(size: int, seed: int) -> bytes:
    """JSON-like event payloads (field names repeat, values vary), which compress about as
    well as typical Kafka payloads do: ~2.5x with lz4/snappy, ~4x with gzip/zstd."""
    rng = np.random.default_rng(seed)
    events = [b"click", b"view", b"purchase", b"login", b"logout", b"search", b"add_to_cart"]
    countries = [b"DE", b"FR", b"US", b"BR", b"IN", b"JP", b"NL", b"ES"]
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
    lines = []
    total = 0
    while total < size:
        n = 2000
        ids = rng.integers(0, 10**9, size=n).tolist()
        users = rng.integers(0, 10**6, size=n).tolist()
        amounts = rng.integers(0, 100_000, size=n).tolist()
        ev = rng.integers(0, len(events), size=n).tolist()
        co = rng.integers(0, len(countries), size=n).tolist()
        pages = [bytes(rng.choice(letters, size=int(k))) for k in rng.integers(4, 16, size=n)]
        for i in range(n):
            line = b'{"id":%d,"user":"u%07d","event":"%s","page":"/p/%s","amount":%d.%02d,"country":"%s","ts":%d}\n' % (
                ids[i], users[i], events[ev[i]], pages[i], amounts[i] // 100, amounts[i] % 100, countries[co[i]],
                1_700_000_000_000 + ids[i] % 10**7,
            )
            lines.append(line)
            total += len(line)
    return b"".join(lines)[:size]


def make_records(count: int, record_size: int, seed: int) -> list[Record]:
    """``count`` records of ``record_size`` bytes of key + value, consecutive offsets from 0."""
    rng = np.random.default_rng(seed)
    value_size = record_size - KEY_SIZE
    corpus = text_corpus(4 * MiB, seed)
    starts = rng.integers(0, len(corpus) - value_size, size=count).tolist()
    keys = rng.integers(0, 10**8, size=count).tolist()
    t0 = 1_700_000_000_000
    return [
        Record(
            i,
            t0 + i // 4,
            b"user-%08d" % keys[i],
            None if i % TOMBSTONE_EVERY == TOMBSTONE_EVERY - 1 else corpus[s : s + value_size],
        )
        for i, s in enumerate(starts)
    ]


def records_per_batch(records: list[Record], record_size: int, codec: CompressionType) -> int:
    """Records of a ~16 KiB producer batch; with a codec, of a batch ~16 KiB once compressed."""
    n = max(1, PRODUCER_BATCH // (record_size + RECORD_OVERHEAD))
    if codec == CompressionType.NONE:
        return n
    sample = build_batch(records[:n], compression=CompressionType.NONE)
    ratio = (len(sample) - 61) / max(1, len(build_batch(records[:n], compression=codec)) - 61)
    return max(1, min(int(n * ratio), MiB // (record_size + RECORD_OVERHEAD)))


# ---- measurements ----------------------------------------------------------------------------


@dataclass
class Row:
    record_size: int
    codec: str
    op: str
    seconds: float
    nbytes: int
    records: int = 0
    batches: int = 0
    codec_seconds: float | None = None  # the codec-alone time of the same work, if any
    target: str = ""


@dataclass
class Case:
    record_size: int
    codec: CompressionType
    data_mib: int
    log: bytes = b""
    log_size: int = 0
    path: str = ""
    group: int = 0
    records: int = 0
    batches: int = 0
    rows: list[Row] = field(default_factory=list)


class Timings:
    """Best (shortest) time of each operation over interleaved rounds.

    Every round runs every operation once, so a slow spell of a shared machine (this one is a
    2-vCPU VM whose speed drifts by up to ~2x over tens of seconds) slows all operations of that
    round alike instead of one operation's every repeat."""

    def __init__(self) -> None:
        self.best: dict[str, float] = {}

    def run(self, name: str, fn: Callable[[], object]) -> object:
        t = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - t
        self.best[name] = min(self.best.get(name, float("inf")), elapsed)
        return result


def chunks(log: bytes, size: int = CHUNK) -> list[tuple[int, int]]:
    """The (start, end) windows a reader with a ``size`` buffer gets, each ending at a batch boundary."""
    out, p, n, view = [], 0, len(log), memoryview(log)
    while p < n:
        r = scan_batches(view, p, min(p + size, n))
        if r.end == p:  # a batch larger than the buffer: the cleaner grows it
            r = scan_batches(view, p, p + r.next_entry_size)
        out.append((p, r.end))
        p = r.end
    return out


def op_read_file(path: str, into: bytearray) -> int:
    """The whole file into memory: the reference of the issue's targets. ``into`` is allocated
    and touched once beforehand, so this measures the copy out of the page cache, not the
    page faults of fresh memory (which would make the figure depend on malloc's thresholds)."""
    with open(path, "rb", buffering=0) as f:
        return f.readinto(into)


def op_read_buffer(path: str) -> int:
    """The file through one reused 1 MiB buffer, as the cleaner's read loop does (no page faults)."""
    buf = bytearray(CHUNK)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            total += n
    return total


def op_scan(log: bytes, windows: list[tuple[int, int]]) -> int:
    view, batches = memoryview(log), 0
    for start, end in windows:
        found = scan_batches(view, start, end).batches
        if found.verify_checksums():
            raise RuntimeError("bad CRC in the benchmark's own log")
        batches += len(found)
    return batches


def op_decode(log: bytes, windows: list[tuple[int, int]]) -> int:
    view, records = memoryview(log), 0
    for start, end in windows:
        found = scan_batches(view, start, end).batches
        if found.verify_checksums():
            raise RuntimeError("bad CRC in the benchmark's own log")
        records += len(decode_records(found))
    return records


def op_build(records: list[Record], group: int, codec: CompressionType) -> list[bytes]:
    return [
        build_batch(records[s : s + group], compression=codec, producer_id=4242, producer_epoch=0, base_sequence=s)
        for s in range(0, len(records), group)
    ]


def keep_half(columns: RecordColumns, seed: int) -> list[tuple[int, np.ndarray]]:
    """Per batch, the rows a cleaning would keep: a random ~half (at least one)."""
    rng = np.random.default_rng(seed)
    keep = rng.random(len(columns)) < 0.5
    starts = columns.batch_record_starts
    plan = []
    for j in range(len(columns.batches)):
        rows = np.arange(starts[j], starts[j + 1], dtype=np.int64)
        kept = rows[keep[rows]]
        plan.append((j, kept if kept.size else rows[-1:]))
    return plan


def op_rebuild(plans: list[tuple[RecordColumns, list[tuple[int, np.ndarray]]]]) -> tuple[int, int]:
    """Every batch of a chunk in one ``rebuild_batches`` call, as the cleaner's filter does."""
    nbytes = nrecords = 0
    for columns, plan in plans:
        batches = np.arange(len(plan), dtype=np.int64)
        rows = np.concatenate([rows for _, rows in plan])
        out = rebuild_batches(columns, batches, rows, np.full(len(plan), -1, dtype=np.int64))
        nbytes += sum(map(len, out))
        nrecords += rows.size
    return nbytes, nrecords


def op_rebuild_each(plans: list[tuple[RecordColumns, list[tuple[int, np.ndarray]]]]) -> tuple[int, int]:
    """The same work one ``rebuild_batch`` call per batch."""
    nbytes = nrecords = 0
    for columns, plan in plans:
        for j, rows in plan:
            nbytes += len(rebuild_batch(columns, j, rows, delete_horizon_ms=None))
            nrecords += rows.size
    return nbytes, nrecords


def sections(batches: Batches) -> list[memoryview]:
    view = memoryview(batches.buffer)
    return [view[p + 61 : p + s] for p, s in zip(batches.positions.tolist(), batches.sizes.tolist(), strict=True)]


def run_case(case: Case, repeat: int, tmpdir: str, profile: str | None) -> None:
    size, codec = case.record_size, case.codec
    count = case.data_mib * MiB // size
    records = make_records(count, size, seed=size)
    case.group = records_per_batch(records, size, codec)
    name = codec.kafka_name
    t = Timings()

    parts = t.run("build", lambda: op_build(records, case.group, codec))
    case.log = b"".join(parts)
    case.records, case.batches = count, len(parts)
    del parts
    fd, case.path = tempfile.mkstemp(suffix=".log", dir=tmpdir)
    with os.fdopen(fd, "wb") as f:
        f.write(case.log)
    view = memoryview(case.log)
    whole = scan_batches(view).batches
    assert len(whole) == case.batches and whole.verify_checksums() == []
    covered = [view[p + 21 : p + n] for p, n in zip(whole.positions.tolist(), whole.sizes.tolist(), strict=True)]
    windows = chunks(case.log)
    big_windows = chunks(case.log, BIG_CHUNK)
    plans = []
    for k, (start, end) in enumerate(windows):
        columns = decode_records(scan_batches(view, start, end).batches)
        plans.append((columns, keep_half(columns, k)))
    compressed = sections(whole) if codec != CompressionType.NONE else []
    plain = [decompress(codec, c) for c in compressed]
    into = bytearray(len(case.log))
    try:
        op_read_file(case.path, into)  # warm-up: the file is in the page cache from now on
        reads = -(-5 // repeat)  # the reads are short: at least 5 of each in all
        for round_ in range(repeat):
            for _ in range(reads):
                assert t.run("read", lambda: op_read_file(case.path, into)) == len(case.log)
                assert t.run("read 1MiB buf", lambda: op_read_buffer(case.path)) == len(case.log)
            assert t.run("scan", lambda: op_scan(case.log, windows)) == case.batches
            t.run("crc32c alone", lambda: [crc32c.crc32c(c) for c in covered])
            assert t.run("decode", lambda: op_decode(case.log, windows)) == count
            assert t.run("decode 4MiB", lambda: op_decode(case.log, big_windows)) == count
            rebuilt_bytes, rebuilt_records = t.run("rebuild 1/2", lambda: op_rebuild(plans))
            assert t.run("rebuild_batch 1/2", lambda: op_rebuild_each(plans)) == (rebuilt_bytes, rebuilt_records)
            if codec != CompressionType.NONE:
                t.run("codec -d", lambda: [decompress(codec, c) for c in compressed])
                t.run("codec -c", lambda: [compress(codec, p) for p in plain])
            if round_ > 0:  # the first build made the log
                t.run("build", lambda: op_build(records, case.group, codec))
        if profile:
            run_profile(profile, case, records, windows)
    finally:
        os.unlink(case.path)

    n, b, best = len(case.log), case.batches, t.best
    verdicts = ["ok" if best[ref] / best["scan"] >= SCAN_TARGET else "BELOW" for ref in ("read", "read 1MiB buf")]
    decode_ok = ""
    if size == 100 and codec == CompressionType.NONE:
        decode_ok = f"{'ok' if count / best['decode'] >= DECODE_TARGET else 'BELOW'} (>= 2 M rec/s)"
    case.rows = [
        Row(size, name, "read", best["read"], n, count, b),
        Row(size, name, "read 1MiB buf", best["read 1MiB buf"], n, count, b),
        Row(size, name, "scan", best["scan"], n, 0, b, codec_seconds=best["crc32c alone"],
            target=f">= {SCAN_TARGET} x read: {verdicts[0]}; x buf: {verdicts[1]}"),
        Row(size, name, "crc32c alone", best["crc32c alone"], n, 0, b),
        Row(size, name, "decode", best["decode"], n, count, b, codec_seconds=best.get("codec -d"), target=decode_ok),
        Row(size, name, "decode 4MiB", best["decode 4MiB"], n, count, b, codec_seconds=best.get("codec -d")),
        Row(size, name, "build", best["build"], n, count, b, codec_seconds=best.get("codec -c")),
        Row(size, name, "rebuild 1/2", best["rebuild 1/2"], rebuilt_bytes, rebuilt_records, b),
        Row(size, name, "rebuild_batch 1/2", best["rebuild_batch 1/2"], rebuilt_bytes, rebuilt_records, b),
    ]
    if codec != CompressionType.NONE:
        case.rows.append(Row(size, name, "codec -d", best["codec -d"], n, count, b))
        case.rows.append(Row(size, name, "codec -c", best["codec -c"], n, count, b))


def run_profile(op: str, case: Case, records: list[Record], windows: list[tuple[int, int]]) -> None:
    work = {
        "scan": lambda: op_scan(case.log, windows),
        "decode": lambda: op_decode(case.log, windows),
        "build": lambda: op_build(records, case.group, case.codec),
    }[op]
    profiler = cProfile.Profile()
    profiler.enable()
    work()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt
    print(f"\nprofile of {op}, {case.record_size} B records, {case.codec.kafka_name} (total {total:.3f} s):")
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:15]
    print(f"  {'own %':>6} {'cum %':>6} {'calls':>9}  function")
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in rows:
        where = f"{os.path.basename(file)}:{line}" if line else file
        print(f"  {100 * tottime / total:6.1f} {100 * cumtime / total:6.1f} {ncalls:9d}  {func} ({where})")


# ---- output ----------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = []
    for dist in ("cramjam", "crc32c", "xxhash"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
    lz4, zstd = _native.codec_library_versions()
    versions.append(f"liblz4 {lz4} and libzstd {zstd} (compiled core)")
    return (
        f"machine: {os.cpu_count()} CPUs ({usable} usable), {cpu}; {platform.system()} {platform.release()}\n"
        f"python {platform.python_version()} ({platform.python_implementation()}), numpy {np.__version__}, "
        + ", ".join(versions)
    )


def print_table(cases: list[Case], repeat: int) -> None:
    header = ("record", "codec", "log MiB", "rec/batch", "operation", "MB/s", "M rec/s", "k batch/s",
              "vs read", "vs buf", "lib share", "target")
    lines = []
    for case in cases:
        read, read_buffer = case.rows[0], case.rows[1]
        read_mbs = read.nbytes / read.seconds / 1e6
        buffer_mbs = read_buffer.nbytes / read_buffer.seconds / 1e6
        for row in case.rows:
            mbs = row.nbytes / row.seconds / 1e6
            lines.append((
                f"{row.record_size} B",
                row.codec,
                f"{case.log_size / MiB:.1f}",
                str(case.group),
                row.op,
                f"{mbs:,.0f}",
                f"{row.records / row.seconds / 1e6:.2f}" if row.records else "-",
                f"{row.batches / row.seconds / 1e3:.1f}" if row.batches else "-",
                f"{mbs / read_mbs:.3f}",
                f"{mbs / buffer_mbs:.3f}",
                f"{100 * row.codec_seconds / row.seconds:.0f}%" if row.codec_seconds else "",
                row.target,
            ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    left = {0, 1, 4, 11}

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                              strict=True)))

    print(fmt(header).rstrip())
    print("  ".join("-" * w for w in widths))
    previous = None
    for line in lines:
        if previous is not None and line[:2] != previous:
            print()
        previous = line[:2]
        print(fmt(line).rstrip())
    print(f"\nbest of {repeat} interleaved rounds (reads: of {repeat * -(-5 // repeat)}); "
          f"chunks of {CHUNK // MiB} MiB; "
          f"'log MiB' = bytes on disk (uncompressed record bytes generated: "
          + ", ".join(f"{c.codec.kafka_name} {c.data_mib} MiB" for c in cases if c.record_size == cases[0].record_size)
          + ")")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data (8 MiB uncompressed, 2-4 MiB per codec)")
    parser.add_argument("--sizes", default="100,1024", help="record sizes in bytes (key + value), comma-separated")
    parser.add_argument("--codecs", default="none,gzip,snappy,lz4,zstd", help="comma-separated codecs")
    parser.add_argument("--mib", type=int, help="MiB of record data per case (overrides the per-codec default)")
    parser.add_argument("--repeat", type=int, help="runs per measurement, best kept (default 3, --quick 1)")
    parser.add_argument("--tmpdir", help="directory for the log file read back (default: the system's)")
    parser.add_argument("--profile", choices=["scan", "decode", "build"],
                        help="also cProfile this operation for every case and print where the time goes")
    args = parser.parse_args(argv)
    repeat = args.repeat or (1 if args.quick else 3)
    sizes = [int(s) for s in args.sizes.split(",")]
    codecs = [CompressionType.from_name(c) for c in args.codecs.split(",")]
    defaults = QUICK_MIB if args.quick else DEFAULT_MIB
    wall0, cpu0 = time.perf_counter(), time.process_time()
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(machine())
    print(f"batches: ~{PRODUCER_BATCH // 1024} KiB producer batches (compressed size for a codec), idempotent "
          f"producer, key {KEY_SIZE} B, ~{100 // TOMBSTONE_EVERY}% tombstones, JSON-like values\n", flush=True)
    cases = []
    for size in sizes:
        for codec in codecs:
            case = Case(size, codec, args.mib or defaults[codec.kafka_name])
            run_case(case, repeat, args.tmpdir or tempfile.gettempdir(), args.profile)
            case.log_size, case.log = len(case.log), b""  # free it before the next case
            cases.append(case)
            print(f"  measured {size} B {codec.kafka_name}: {case.log_size / MiB:.1f} MiB log, "
                  f"{case.records:,} records", file=sys.stderr, flush=True)
    print()
    print_table(cases, repeat)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"run: {wall:.0f} s wall, {cpu:.0f} s CPU ({100 * cpu / wall:.0f}%); "
          f"1-min load average {load0:.2f} before, {load1:.2f} after")
    if cpu < 0.9 * wall:
        print("WARNING: this process got the CPU only part of the time (other work on the machine?): "
              "figures are low and the ratios noisy; run again on a quiet machine.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
