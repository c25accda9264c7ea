"""The Spark jobs against the single-node engine, on the same generated data, in one run.

Two data sets, generated once (deterministic):

- a *fleet*: one log dir of ``--partitions`` partitions (lz4, tombstones, transactions);
- a *big* partition: one log dir with one partition of ``--big-records`` records in
  ``--segment-mb`` segments, grouped by the policy's ``segmentBytes`` (``--group-mb``) into
  several groups, so the rewrite has parallel work.

Measured, each on a fresh copy of the input (copies are not timed), with a fixed clock:

1. the single-node engine, ``cleaning.clean`` (what ``kafka-cleaner clean`` runs);
2. Spark start-up: a new SparkSession plus a first job that starts the Python workers;
3. ``spark compact`` in place on the fleet, and ``spark compact-large`` in place on the big
   partition, on ``local[2]``; the ratio to the single-node time of the same data, and the
   check that the bytes are identical;
4. ``compact-large`` on the big partition with a dedupe buffer that holds a fraction of its
   keys (``--past-map``, default 1/4): all rounds in one invocation, against ``clean``'s
   rounds of the same data;
5. ``compact-large`` again on ``local[1]``: the phases' wall times with one and two
   executor slots, the sum of the task times (the work, which should not change) and the
   longest task (the critical path). Phase times that fall from local[1] to local[2] while
   the work stays the same show the design scales with executors.

Per job, from Spark's own event log (``spark.eventLog``; the executors' process-tree
metrics on, polled every 100 ms): the shuffle bytes written and read, and the executors' peak
memory - the JVM heap and the RSS of the Python workers, where the tasks run (in local mode
the one executor is the driver's JVM). The driver's own bytes read and written come from
``/proc/self/io``.

Never asserted anywhere: numbers depend on the machine and on what else runs on it (the
run line prints the load average; a 2-vCPU VM shared with other work gives noisy figures).

    .venv/bin/python bench/spark.py           # ~200 MB big partition, ~1-2 min
    .venv/bin/python bench/spark.py --quick   # ~25 MB, ~40 s (mostly Spark start-up)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import parse_policy
from cleaner.generate import GeneratorConfig, generate
from cleaner.storage.log_dir import LogDirectory

NOW = 1_700_000_000_000


def files_of(root: Path) -> dict[str, bytes]:
    out = {}
    for tp, d in LogDirectory(root).partition_dirs().items():
        for p in sorted(d.iterdir()):
            out[f"{tp}/{p.name}"] = p.read_bytes()
    return out


def log_mb(root: Path) -> float:
    return sum(p.stat().st_size for p in root.rglob("*.log")) / 1e6


def driver_io() -> tuple[int, int]:
    """Bytes this process (the Spark driver: its Python tasks run in worker processes of
    their own) has read and written through system calls so far (``/proc/self/io``)."""
    with open("/proc/self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


EVENT_LOG_CONF = {
    "spark.eventLog.enabled": "true",
    "spark.eventLog.compress": "false",
    "spark.eventLog.logStageExecutorMetrics": "true",
    "spark.executor.processTreeMetrics.enabled": "true",
    "spark.executor.metrics.pollingInterval": "100ms",
}


@dataclass
class JobMetrics:
    """What Spark's event log says about the jobs of one job group."""

    shuffle_written: int = 0
    shuffle_read: int = 0
    jobs: int = 0
    tasks: int = 0
    peak_jvm_heap: int = 0
    peak_python_rss: int = 0


def job_metrics(event_dir: Path) -> dict[str, JobMetrics]:
    """Per job group (``SparkContext.setJobGroup``), summed over the tasks of its jobs' stages:
    shuffle bytes from each task's metrics; peak memory as the largest of the executors' peaks
    the tasks and stages report (``Task Executor Metrics``, ``SparkListenerStageExecutorMetrics``)."""
    stage_group: dict[int, str] = {}
    metrics: dict[str, JobMetrics] = {}
    # Spark 4 writes a directory per application (``eventlog_v2_<app>/events_<n>_<app>``).
    for path in sorted(event_dir.rglob("events_*")):
        with open(path) as f:
            for line in f:
                event = json.loads(line)
                kind = event["Event"]
                if kind == "SparkListenerJobStart":
                    group = (event.get("Properties") or {}).get("spark.jobGroup.id")
                    if group:
                        stage_group.update({sid: group for sid in event["Stage IDs"]})
                        metrics.setdefault(group, JobMetrics()).jobs += 1
                    continue
                group = stage_group.get(event.get("Stage ID", -1))
                if group is None:
                    continue
                m = metrics[group]
                peaks = event.get("Task Executor Metrics") or event.get("Executor Metrics") or {}
                m.peak_jvm_heap = max(m.peak_jvm_heap, peaks.get("JVMHeapMemory", 0))
                m.peak_python_rss = max(m.peak_python_rss, peaks.get("ProcessTreePythonRSSMemory", 0))
                if kind == "SparkListenerTaskEnd":
                    task = event.get("Task Metrics") or {}
                    read = task.get("Shuffle Read Metrics") or {}
                    m.tasks += 1
                    m.shuffle_written += (task.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0)
                    m.shuffle_read += read.get("Remote Bytes Read", 0) + read.get("Local Bytes Read", 0)
    return metrics


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def makespan(durations: list[float], slots: int) -> float:
    """Longest-first list scheduling of ``durations`` on ``slots`` executors: the phase's
    time if each unit ran on a free core."""
    loads = [0.0] * slots
    for d in sorted(durations, reverse=True):
        loads[loads.index(min(loads))] += d
    return max(loads)


def best(repeat: int, fn):
    """The fastest of ``repeat`` runs (each on fresh input): a shared machine slows some runs."""
    results = [fn() for _ in range(repeat)]
    return min(results, key=lambda r: r[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small data (start-up dominates)")
    ap.add_argument("--big-records", type=int, default=None, help="records of the big partition (default 4M)")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the fleet")
    ap.add_argument("--fleet-records", type=int, default=None, help="records per fleet partition (default 250k)")
    ap.add_argument("--segment-mb", type=int, default=None, help="segment size of the big partition (default 8)")
    ap.add_argument("--group-mb", type=int, default=None, help="the policy's segmentBytes: a group's size (default 32)")
    ap.add_argument("--codec", default="lz4")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement (best is shown)")
    ap.add_argument("--past-map", type=float, default=0.25,
                    help="the past-the-map case's dedupe buffer, as a fraction of the big partition's keys")
    ap.add_argument("--tmpdir", default=None)
    args = ap.parse_args()
    big_records = args.big_records or (500_000 if args.quick else 4_000_000)
    fleet_records = args.fleet_records or (30_000 if args.quick else 250_000)
    segment_mb = args.segment_mb or (1 if args.quick else 8)
    group_mb = args.group_mb or (4 if args.quick else 32)

    os.environ.setdefault("PYTHONSAFEPATH", "1")
    from cleaner.spark.compact import compact
    from cleaner.spark.compact_large import compact_large
    from cleaner.spark.session import spark_session

    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-", dir=args.tmpdir))
    policy = parse_policy({"topics": [{"match": ".*", "cleanupPolicy": "compact", "segmentBytes": group_mb << 20}]})
    try:
        common = dict(tombstones=0.05, compression=args.codec, now_ms=NOW)
        fleet, big = tmp / "fleet", tmp / "big"
        t_gen, _ = timed(
            lambda: generate(
                fleet,
                GeneratorConfig(
                    topics=1,
                    partitions=args.partitions,
                    records=fleet_records,
                    keys=fleet_records // 10,
                    transactions=0.1,
                    segment_bytes=max(segment_mb << 18, 1 << 18),
                    **common,
                ),
            )
        )
        t_gen2, _ = timed(
            lambda: generate(
                big,
                GeneratorConfig(
                    topics=1,
                    partitions=1,
                    records=big_records,
                    keys=big_records // 10,
                    topic_prefix="big",
                    segment_bytes=segment_mb << 20,
                    **common,
                ),
            )
        )
        big_dir = big / "big-0-0"
        segments = len(list(big_dir.glob("*.log")))
        print(
            f"machine: {os.cpu_count()} CPUs; {platform.processor() or platform.machine()}; "
            f"python {platform.python_version()}",
            file=sys.stderr,
        )
        print(
            f"data: fleet {args.partitions} x {fleet_records:,} records ({log_mb(fleet):.0f} MB {args.codec}); "
            f"big 1 x {big_records:,} records ({log_mb(big):.0f} MB, {segments} segments of {segment_mb} MB, "
            f"groups up to {group_mb} MB); generated in {t_gen + t_gen2:.1f} s",
            file=sys.stderr,
        )

        n = [0]

        def copy(src: Path) -> Path:
            n[0] += 1
            dst = tmp / f"run{n[0]}"
            shutil.copytree(src, dst)
            return dst

        def single(src: Path):
            d = copy(src)
            t, _ = timed(lambda: cleaning.clean([d], policy, FixedTime(NOW)))
            return t, d

        t_single_fleet, fleet_ref = best(args.repeat, lambda: single(fleet))
        t_single_big, big_ref = best(args.repeat, lambda: single(big))
        # Past the map: a dedupe buffer for about a fraction of the keys (OffsetMap: ~20 bytes a
        # slot, 90% of the slots used).
        small_map = parse_policy({
            "topics": [{"match": ".*", "cleanupPolicy": "compact", "segmentBytes": group_mb << 20}],
            "cleaner": {"dedupeBufferSize": int(big_records // 10 * args.past_map * 20 / 0.9)},
        })  # fmt: skip

        def single_small(src: Path):
            d = copy(src)
            t, outcome = timed(lambda: cleaning.clean([d], small_map, FixedTime(NOW)))
            return t, (d, len(outcome.results))

        t_single_past, (past_ref, past_rounds) = best(args.repeat, lambda: single_small(big))

        rows: list[tuple[str, str]] = []
        events = tmp / "events"
        events.mkdir()
        t_start, spark = timed(lambda: spark_session("local[2,4]", app_name="bench", conf={
            **EVENT_LOG_CONF, "spark.eventLog.dir": events.as_uri()}))
        t_warm, _ = timed(
            lambda: (
                spark.sparkContext.parallelize(range(2), 2).map(lambda _: __import__("cleaner.spark.phases")).count()
            )
        )
        rows.append(("spark start-up (session + first job)", f"{t_start:.1f} s + {t_warm:.1f} s"))

        def group(name: str) -> None:
            spark.sparkContext.setJobGroup(name, name)

        def spark_compact():
            group("compact, fleet")
            d = copy(fleet)
            t, r = timed(lambda: compact(spark, [d], policy, now_ms=NOW, staging=tmp / f"stage{n[0]}"))
            return t, (d, r)

        driver: dict[str, tuple[int, int]] = {}

        def spark_large():
            group("compact-large in place")
            d = copy(big)
            read0, wrote0 = driver_io()
            t, r = timed(lambda: compact_large(spark, d / "big-0-0", policy, now_ms=NOW, staging=tmp / f"stage{n[0]}"))
            read1, wrote1 = driver_io()
            driver["in place"] = (read1 - read0, wrote1 - wrote0)
            return t, (d, r.first)  # the data fits the map: one round

        def spark_large_output():
            group("compact-large --output")
            d = copy(big)
            out = tmp / f"out{n[0]}"
            read0, wrote0 = driver_io()
            compact_large(spark, d / "big-0-0", policy, now_ms=NOW, staging=tmp / f"stage{n[0]}", output=out)
            read1, wrote1 = driver_io()
            driver["--output"] = (read1 - read0, wrote1 - wrote0)

        def spark_past_map():
            group("compact-large past the map")
            d = copy(big)
            t, r = timed(lambda: compact_large(spark, d / "big-0-0", small_map, now_ms=NOW,
                                               staging=tmp / f"stage{n[0]}"))  # fmt: skip
            return t, (d, r)

        t_compact, (fleet_out, _) = best(args.repeat, spark_compact)
        t_large2, (big_out, large2) = best(args.repeat, spark_large)
        spark_large_output()
        t_past, (past_out, past) = best(args.repeat, spark_past_map)
        rows.append(("single node clean, fleet", f"{t_single_fleet:.2f} s"))
        rows.append(
            (
                "spark compact, fleet, local[2]",
                f"{t_compact:.2f} s  ratio {t_compact / t_single_fleet:.2f}x"
                f"  identical: {files_of(fleet_out) == files_of(fleet_ref)}",
            )
        )
        rows.append(("single node clean, big partition", f"{t_single_big:.2f} s"))
        rows.append(
            (
                "spark compact-large, big, local[2]",
                f"{t_large2:.2f} s  ratio {t_large2 / t_single_big:.2f}x"
                f"  identical: {files_of(big_out) == files_of(big_ref)}",
            )
        )

        rows.append((f"single node clean, big, past the map ({args.past_map:.0%} of its keys)",
                     f"{t_single_past:.2f} s, {past_rounds} rounds"))
        rows.append(
            (
                "spark compact-large, big, past the map, local[2]",
                f"{t_past:.2f} s, {len(past.rounds)} rounds in one job  ratio {t_past / t_single_past:.2f}x"
                f"  identical: {files_of(past_out) == files_of(past_ref)}",
            )
        )
        reads = [len(r.outcome.tasks.map_segment) for r in past.rounds if r.outcome is not None]
        distinct = [len(set(r.outcome.tasks.map_segment)) for r in past.rounds if r.outcome is not None]
        rows.append(("phase 1 past the map, segment reads per round",
                     f"{reads} for {distinct} segments (a round cut short by the map reads again only "
                     f"the segment the cut falls in)"))
        # Where a round past the map spends its time: the driver's plan; phase 1, from the
        # round's start to its last reducer's end (a cut round's first job, its histogram job and
        # the cut job's phase 1); phase 2, the rewrite after that; the commit.
        for part in ("plan", "phase1", "phase2", "commit", "total"):
            rows.append((f"  past the map, {part} s per round",
                         " ".join(f"{r.seconds.get(part, 0.0):.2f}" for r in past.rounds)))

        big_bytes = log_mb(big) * 1e6
        for mode, (read, wrote) in driver.items():
            rows.append((f"driver I/O, compact-large {mode}",
                         f"read {read / 1e6:.1f} MB ({read / big_bytes:.0%} of the partition's "
                         f"{big_bytes / 1e6:.0f} MB), wrote {wrote / 1e6:.1f} MB"))

        spark.stop()  # the event log is complete once the application has ended
        for name, m in job_metrics(events).items():
            rows.append((f"spark: {name}",
                         f"{m.jobs} jobs, {m.tasks} tasks, shuffle {m.shuffle_written / 1e6:.1f} MB written "
                         f"{m.shuffle_read / 1e6:.1f} MB read; executor peaks: JVM heap {m.peak_jvm_heap / 1e6:.0f} "
                         f"MB, Python workers' RSS {m.peak_python_rss / 1e6:.0f} MB"))
        spark1 = spark_session("local[1,4]", app_name="bench-1")
        spark1.sparkContext.parallelize(range(1), 1).map(lambda _: __import__("cleaner.spark.phases")).count()

        def spark_large1():
            d = copy(big)
            t, r = timed(lambda: compact_large(spark1, d / "big-0-0", policy, now_ms=NOW, staging=tmp / f"stage{n[0]}"))
            return t, r.first

        t_large1, large1 = best(args.repeat, spark_large1)
        spark1.stop()
        rows.append(("spark compact-large, big, local[1]", f"{t_large1:.2f} s  ratio {t_large1 / t_single_big:.2f}x"))

        print()
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
        print()
        print("compact-large, per phase       local[1]      local[2]")
        for phase, kinds in (("plan", ()), ("phase1", ("map", "reduce")), ("phase2", ("rewrite",)), ("commit", ())):
            a, b = large1.seconds.get(phase, 0.0), large2.seconds.get(phase, 0.0)
            print(f"  {phase:<14} wall       {a:>8.2f} s    {b:>8.2f} s   speed-up {a / b if b else 0:.2f}x")
            for kind in kinds:
                for label, run in (("local[1]", large1), ("local[2]", large2)):
                    wall, cpu = getattr(run.outcome.tasks, kind), getattr(run.outcome.tasks, f"{kind}_cpu")
                    busy = sum(wall) / run.seconds[phase] if run.seconds.get(phase) else 0.0
                    share = sum(cpu) / sum(wall) if sum(wall) else 0.0
                    unit = {"map": "segments", "reduce": "reducers", "rewrite": "groups"}[kind]
                    passes = run.outcome.tasks.reduce_passes if kind == "reduce" else []
                    print(
                        f"    {kind:<8} {label}: {len(wall):>3} {unit:<8} CPU {sum(cpu):6.2f} s, "
                        f"wall {sum(wall):6.2f} s (longest {max(wall, default=0):.2f} s); "
                        f"at once {busy:.2f}; CPU/wall {share:.2f}"
                        + (f"; sub-ranges (spill) up to {max(passes)}" if passes else "")
                    )
        print("\n  projected phase times on k executors: list scheduling of the measured units' CPU times")
        print("  (segments for phase 1's map, reducers, groups for phase 2; the per-job overhead not included)")
        tasks = large1.outcome.tasks
        base = None
        for k in (1, 2, 4, 8):
            p1 = makespan(tasks.map_cpu, k) + makespan(tasks.reduce_cpu, k)
            p2 = makespan(tasks.rewrite_cpu, k)
            base = base or (p1 + p2)
            print(f"    k={k}: phase1 {p1:5.2f} s  phase2 {p2:5.2f} s  speed-up {base / (p1 + p2):.2f}x")
        print(
            f"  groups {len(large2.groups)}, offset map keys {large2.map_keys:,}, "
            f"dirty section [{large2.first_dirty_offset}, {large2.end_offset})"
        )
        load = os.getloadavg()
        print(f"\nrun: load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
