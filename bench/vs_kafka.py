"""kafka-cleaner beside Apache Kafka's own cleaner, on copies of the same partitions, in one run.

For each case a single-partition log dir is generated (``kafka-cleaner generate``), copied
twice, and cleaned once by each cleaner until nothing is eligible, with the same topic
configs, the same fixed clock and the same broker cleaner settings (128 MiB dedupe buffer,
512 KiB I/O buffer, one thread):

- **kafka-cleaner**: the whole ``kafka-cleaner clean`` process (interpreter start and
  imports included), and the engine's own time (the sum of each round's ``CleanerStats``).
- **Kafka** (``scripts/kafka-clean-once.sh``, its ``LogCleanerManager`` and ``Cleaner``): the
  time of the ``Cleaner.doClean`` calls in a JVM whose JIT a first clean of another copy has
  warmed up (a broker's cleaner is long-lived), the same in a fresh JVM, and the whole fresh
  JVM process (start, log loading and closing included). The JVM runs with the broker's
  default heap and GC flags (``-Xmx1G -Xms1G -XX:+UseG1GC -XX:MaxGCPauseMillis=20``, full JIT).

Printed per case and cleaner: rounds, clean seconds, M records/s and MB/s (input records and
``.log`` bytes over the clean time), the ratio to a plain fsynced read+write copy of the
same ``.log`` files, the whole process's seconds and peak RSS (the child's ``ru_maxrss``);
then kafka-cleaner's speed over Kafka's (clean time and whole process). Figures depend on the
machine; nothing asserts them.

Cases: 100-byte records uncompressed (2 M records: issue 13's end-to-end figure) and lz4;
1 KiB records uncompressed and zstd; a ``__consumer_offsets``-like partition (a few thousand
hot keys rewritten over and over, small values, small batches); a partition whose distinct
keys overflow a 16 MiB dedupe buffer (scaled with the case) (several rounds; the two maps hold different numbers of
keys per round, README "How it maps to Kafka").

    .venv/bin/python bench/vs_kafka.py              # ~200 MB per case, Kafka 4.3.1 (~3 minutes)
    .venv/bin/python bench/vs_kafka.py --quick      # ~25 MB per case
    .venv/bin/python bench/vs_kafka.py --kafka 4.3.1,3.9.2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))  # bench/ is not a package; PYTHONSAFEPATH keeps it off sys.path

from clean import plain_copy  # noqa: E402

from cleaner.generate import GeneratorConfig, generate  # noqa: E402

HARNESS = REPO / "scripts" / "kafka-clean-once.sh"
KAFKA_CLEANER = REPO / ".venv" / "bin" / "kafka-cleaner"
BROKER_JVM = "-Xmx1G -Xms1G -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35"
NOW_MS = 1_700_000_000_000
MIB = 1024 * 1024


@dataclass
class Case:
    name: str
    record_bytes: int
    codec: str
    records: int
    keys: int
    key_skew: float = 0.9
    tombstones: float = 0.05
    batch_bytes: int = 16384
    dedupe_buffer_size: int = 128 * MIB
    min_cleanable_dirty_ratio: float = 0.5


def cases(scale: float) -> list[Case]:
    def n(records: int) -> int:
        return max(int(records * scale), 1000)

    return [
        Case("100 B none", 100, "none", n(2_000_000), n(500_000)),
        Case("100 B lz4", 100, "lz4", n(2_000_000), n(500_000)),
        Case("1 KiB none", 1024, "none", n(200_000), n(50_000)),
        Case("1 KiB zstd", 1024, "zstd", n(200_000), n(50_000)),
        Case("offsets-like", 100, "none", n(2_000_000), 5_000, key_skew=0.3, tombstones=0.01, batch_bytes=1024),
        Case(
            "map overflow", 100, "none", n(2_000_000), n(1_800_000), key_skew=0.0, tombstones=0.0,
            dedupe_buffer_size=max(int(16 * MIB * scale), MIB), min_cleanable_dirty_ratio=0.01,
        ),
    ]


@dataclass
class Run:
    rounds: int
    clean_secs: float
    process_secs: float
    rss_mb: float
    cold_clean_secs: float | None = None
    """Kafka: the clean time in a fresh JVM (``clean_secs`` is after a warm-up clean)."""


def run_isolated(args: list[str], env: dict | None = None) -> tuple[str, float, float]:
    """(stdout, wall seconds, peak RSS MB) of ``args``, run from a fresh Python process so
    that ``RUSAGE_CHILDREN`` holds that one child's peak RSS (the JVM itself: the harness
    script execs java)."""
    probe = (
        "import json, resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "wall = time.perf_counter() - t\n"
        "if p.returncode: sys.stderr.write(p.stderr[-3000:]); sys.exit(p.returncode)\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(json.dumps({'stdout': p.stdout, 'wall': wall, 'rss': rss}))\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", probe, *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout)
    return out["stdout"], out["wall"], out["rss"]


def topic_config(case: Case, segment_bytes: int) -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "segment.bytes": str(segment_bytes),
        "min.cleanable.dirty.ratio": str(case.min_cleanable_dirty_ratio),
    }


def run_ours(log_dir: Path, case: Case, segment_bytes: int) -> Run:
    policy = log_dir.parent / "policy.json"
    policy.write_text(json.dumps({
        "mode": "compact",
        "topics": [{"match": ".*", "cleanupPolicy": "compact", "segmentBytes": segment_bytes,
                    "minCleanableDirtyRatio": case.min_cleanable_dirty_ratio}],
        "cleaner": {"dedupeBufferSize": case.dedupe_buffer_size},
    }))
    stdout, wall, rss = run_isolated(
        [str(KAFKA_CLEANER), "clean", str(log_dir), "--policy", str(policy), "--now-ms", str(NOW_MS), "--json"]
    )
    cleans = json.loads(stdout)["cleans"]
    return Run(len(cleans), sum(c["elapsedSeconds"] for c in cleans), wall, rss)


def run_kafka(version: str, source: Path, work: Path, case: Case, segment_bytes: int) -> Run:
    """Kafka's cleaner twice: in a fresh JVM (the whole process's time and peak RSS, the cold
    clean time), then in a JVM that first cleaned another copy of the same data (the clean
    time of a broker whose JIT has warmed up, which is the figure compared)."""

    def harness(extra: list[str]) -> tuple[dict, float, float]:
        target = work / "kafka"
        shutil.copytree(source, target)
        args = [str(HARNESS), version, "--log-dir", str(target), "--now-ms", str(NOW_MS),
                "--dedupe-buffer-size", str(case.dedupe_buffer_size), *extra]
        for name, value in topic_config(case, segment_bytes).items():
            args += ["--config", f"{name}={value}"]
        stdout, wall, rss = run_isolated(args, dict(os.environ, KAFKA_HARNESS_JVM_OPTS=BROKER_JVM))
        shutil.rmtree(target)
        return json.loads(stdout.strip().splitlines()[-1]), wall, rss

    cold, wall, rss = harness([])
    warm_up = work / "warm-up"
    shutil.copytree(source, warm_up)
    warm, _, _ = harness(["--warm-up-dir", str(warm_up)])
    shutil.rmtree(warm_up)
    return Run(len(warm["rounds"]), warm["cleanNanos"] / 1e9, wall, rss, cold_clean_secs=cold["cleanNanos"] / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="~25 MB per case instead of ~200 MB")
    parser.add_argument("--scale", type=float, default=None, help="multiply every case's records by this")
    parser.add_argument("--kafka", default="4.3.1", help="Kafka lines to run, comma-separated (4.3.1, 3.9.2)")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = parser.parse_args()
    scale = args.scale or (0.125 if args.quick else 1.0)
    versions = args.kafka.split(",")
    chosen = [c for c in cases(scale) if args.cases is None or c.name in args.cases.split(",")]
    print(f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python "
          f"{platform.python_version()}; Kafka JVM: {BROKER_JVM}; one cleaner thread, 512 KiB I/O buffer")
    header = (f"{'case':<14}{'cleaner':<15}{'log MB':>8}{'records':>11}{'rounds':>7}{'clean s':>9}{'Mrec/s':>8}"
              f"{'MB/s':>8}{'x copy':>8}{'process s':>10}{'cold s':>8}{'RSS MB':>8}")
    print(header)
    print("-" * len(header))
    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-vs-kafka-") as tmp:
        root = Path(tmp)
        for case in chosen:
            source = root / "source"
            segment_bytes = max(case.records * case.record_bytes // 8, MIB)
            summary = generate(source, GeneratorConfig(
                topics=1, partitions=1, records=case.records, keys=case.keys, key_skew=case.key_skew,
                value_bytes=max(case.record_bytes - 30, 8), tombstones=case.tombstones, compression=case.codec,
                segment_bytes=segment_bytes, batch_bytes=case.batch_bytes, seed=11, now_ms=NOW_MS,
            ))
            pdir = next(p for p in source.iterdir() if p.is_dir())
            log_mb = sum(f.stat().st_size for f in pdir.glob("*.log")) / 1e6
            records = summary.totals["records"]
            copy_secs = min(plain_copy(pdir, root / f"copy-{i}") for i in range(3))  # fsync timings are noisy
            for i in range(3):
                shutil.rmtree(root / f"copy-{i}")
            copy_mbps = log_mb / copy_secs
            target = root / "ours"
            shutil.copytree(source, target)
            runs = {"kafka-cleaner": run_ours(target, case, segment_bytes)}
            shutil.rmtree(target)
            for version in versions:
                runs[f"Kafka {version}"] = run_kafka(version, source, root, case, segment_bytes)
            shutil.rmtree(source)
            for i, (who, r) in enumerate(runs.items()):
                mbps = log_mb / r.clean_secs
                cold = f"{r.cold_clean_secs:>8.2f}" if r.cold_clean_secs is not None else f"{'-':>8}"
                print(f"{case.name if i == 0 else '':<14}{who:<15}{log_mb:>8.1f}{records:>11,}{r.rounds:>7}"
                      f"{r.clean_secs:>9.2f}{records / r.clean_secs / 1e6:>8.2f}{mbps:>8.1f}{mbps / copy_mbps:>8.3f}"
                      f"{r.process_secs:>10.2f}{cold}{r.rss_mb:>8.0f}")
            ours = runs["kafka-cleaner"]
            for version in versions:
                theirs = runs[f"Kafka {version}"]
                ratios.append((case.name, version, theirs.clean_secs / ours.clean_secs,
                               theirs.process_secs / ours.process_secs))
            print(f"{'':<14}{'plain copy':<15}{log_mb:>8.1f}{'':>11}{'':>7}{copy_secs:>9.2f}{'':>8}{copy_mbps:>8.0f}")
    print()
    print("kafka-cleaner's speed over Kafka's (>1: kafka-cleaner is faster):")
    for name, version, clean_ratio, process_ratio in ratios:
        print(f"  {name:<14} vs Kafka {version}: clean {clean_ratio:.2f}x (warm JVM), "
              f"whole process {process_ratio:.2f}x")
    print("clean s: kafka-cleaner's engine rounds (CleanerStats) / Kafka's Cleaner.doClean calls in a JVM warmed up "
          "by a first clean of the same data; cold s: Kafka's doClean calls in a fresh JVM; process s and RSS: the "
          "whole `kafka-cleaner clean` process / the whole fresh JVM (start, loading the log, cleaning, closing). "
          "x copy: MB/s over a plain fsynced read+write copy of the same .log files.")


if __name__ == "__main__":
    main()
