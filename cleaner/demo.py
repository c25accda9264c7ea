"""``kafka-cleaner demo`` (what ``make demo`` runs): generate a realistic broker data
directory, show what is dirty, clean it with progress, and show before and after.

The demo data dir is recreated on each run; a marker file guards against ever deleting
a directory the demo did not create.
"""

from __future__ import annotations

import shutil
import sys
import time as _time
from dataclasses import dataclass
from pathlib import Path

import click
import yaml
from rich.console import Console
from rich.table import Table

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import Policy, parse_policy
from cleaner.generate import DEFAULT_NOW_MS, GeneratorConfig, estimate_log_bytes, generate
from cleaner.output import ByteProgress, binary_bytes
from cleaner.segment_facts import FactsCache

MARKER = ".kafka-cleaner-demo"
HOUR_MS = 3_600_000
SEGMENT_BYTES = 4 * 1024 * 1024

DEMO_POLICY = {
    "mode": "compact",
    "topics": [
        {
            "match": ".*",
            "cleanupPolicy": "compact",
            "segmentBytes": SEGMENT_BYTES,
            "minCleanableDirtyRatio": 0.5,
            "deleteRetentionMs": 86_400_000,
        }
    ],
    "cleaner": {"threads": 2},
}


def demo_config(size_mb: int, seed: int) -> GeneratorConfig:
    """Four topics (codecs none, lz4, zstd, snappy), three partitions each, skewed keys,
    5% tombstones, 10% transactional batches, idempotent producers; ``size_mb`` is about
    the size on disk (the codecs shrink the JSON-like values 2-4x)."""
    value_bytes = 200
    partitions = 4 * 3
    records = max(1000, 2 * size_mb * 1024 * 1024 // (partitions * (value_bytes + 40)))
    return GeneratorConfig(
        topics=4,
        partitions=3,
        records=records,
        keys=max(100, records // 8),
        key_skew=1.1,
        value_bytes=value_bytes,
        tombstones=0.05,
        compression="mixed",
        transactions=0.1,
        idempotent=True,
        segment_bytes=SEGMENT_BYTES,
        seed=seed,
        topic_prefix="demo",
    )


@dataclass
class _Row:
    bytes: int
    records: int
    ratio: float
    eligible: bool


def _snapshot(data_dir: Path, policy: Policy, now_ms: int) -> dict[str, _Row]:
    out = {}
    for s in cleaning.status([data_dir], policy, FixedTime(now_ms), facts_cache=FactsCache()):
        r = s.report
        out[str(r.topic_partition)] = _Row(
            r.size_bytes, s.facts.records if s.facts else 0, r.cleanable_ratio, r.eligible
        )
    return out


def _prepare(data_dir: Path) -> None:
    if data_dir.exists():
        if not (data_dir / MARKER).exists() and any(data_dir.iterdir()):
            raise click.ClickException(f"{data_dir} exists and was not created by the demo; choose another --dir")
        shutil.rmtree(data_dir)


@click.command("demo")
@click.option(
    "--dir",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-data"),
    show_default=True,
    help="Where to generate the broker data dir (recreated on each run).",
)
@click.option(
    "--size-mb",
    type=click.IntRange(min=1),
    default=300,
    show_default=True,
    help="Approximate uncompressed size of the generated data.",
)
@click.option("--seed", type=int, default=0, show_default=True)
def demo_command(data_dir: Path, size_mb: int, seed: int) -> None:
    """Generate a realistic Kafka log dir and clean it, showing before and after."""
    console = Console() if sys.stdout.isatty() else Console(width=200)  # a pipe gets full values
    _prepare(data_dir)
    config = demo_config(size_mb, seed)
    policy = parse_policy(DEMO_POLICY, source="<demo policy>")
    now_ms = (config.now_ms or DEFAULT_NOW_MS) + HOUR_MS

    console.rule("1. generate a broker data dir")
    with ByteProgress("generating", estimate_log_bytes(config)).shown_while() as bar:
        summary = generate(data_dir, config, progress=bar.advance)
    (data_dir / MARKER).write_text("created by kafka-cleaner demo\n")
    policy_path = data_dir.with_name(data_dir.name + ".policy.yaml")
    policy_path.write_text(yaml.safe_dump({"spec": DEMO_POLICY}, sort_keys=False))
    t = summary.totals
    console.print(
        f"{data_dir}: {t['partitions']} partitions, {t['segments']} segments, "
        f"{binary_bytes(t['bytes'])}, {t['records']:,} records ({t['tombstones']:,} tombstones, "
        f"{t['transactions_aborted']} aborted transactions) in {summary.elapsed_seconds:.1f} s"
    )

    console.rule("2. what is dirty (kafka-cleaner status)")
    before = _snapshot(data_dir, policy, now_ms)
    console.print(
        f"{sum(r.eligible for r in before.values())} of {len(before)} partitions are eligible "
        f"(cleanable ratio > {policy.topics[0].min_cleanable_dirty_ratio})"
    )

    console.rule("3. clean (kafka-cleaner clean)")
    work = sum(r.bytes for r in before.values()) * 3  # read by the map and copy passes, and written
    started = _time.monotonic()
    with ByteProgress("cleaning (bytes read and written)", work).shown_while() as bar:
        outcome = cleaning.clean([data_dir], policy, FixedTime(now_ms), io_meter=bar.advance)
    elapsed = _time.monotonic() - started
    after = _snapshot(data_dir, policy, now_ms)

    console.rule("4. before and after")
    table = Table(show_lines=False)
    for col in (
        "partition",
        "size before",
        "size after",
        "records before",
        "records after",
        "dirty before",
        "dirty after",
    ):
        table.add_column(col, justify="left" if col == "partition" else "right")
    for tp in sorted(before):
        b, a = before[tp], after.get(tp, _Row(0, 0, 0.0, False))
        table.add_row(
            tp,
            binary_bytes(b.bytes),
            binary_bytes(a.bytes),
            f"{b.records:,}",
            f"{a.records:,}",
            f"{b.ratio:.2f}",
            f"{a.ratio:.2f}",
        )
    bytes_before = sum(r.bytes for r in before.values())
    bytes_after = sum(r.bytes for r in after.values())
    records_before = sum(r.records for r in before.values())
    records_after = sum(r.records for r in after.values())
    table.add_section()
    table.add_row(
        "total",
        binary_bytes(bytes_before),
        binary_bytes(bytes_after),
        f"{records_before:,}",
        f"{records_after:,}",
        "",
        "",
    )
    console.print(table)
    read = sum(r.stats.bytes_read + r.stats.map_bytes_read for r in outcome.results)
    console.print(
        f"{len(outcome.results)} cleans in {elapsed:.1f} s: {binary_bytes(bytes_before)} -> "
        f"{binary_bytes(bytes_after)} ({100 * (1 - bytes_after / bytes_before) if bytes_before else 0:.0f}% smaller), "
        f"{bytes_before / 1048576 / elapsed if elapsed else 0:,.1f} MiB/s of log, "
        f"{read / 1048576 / elapsed if elapsed else 0:,.1f} MiB/s read"
    )
    if outcome.uncleanable:
        console.print(f"[red]uncleanable partitions: {outcome.uncleanable}[/red]")
        raise SystemExit(3)
    console.print(
        f"Next: kafka-cleaner status {data_dir} --policy {policy_path} --now-ms {now_ms}\n"
        f"      kafka-cleaner dump --verify {data_dir}"
    )
