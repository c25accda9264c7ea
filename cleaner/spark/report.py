"""``kafka-cleaner spark report``: read-only, one row per partition and a per-topic rollup.

Stage 0 (one task per partition) computes what ``kafka-cleaner status --json`` prints for
the partition - the same code, ``cleaning.status`` over a one-partition view - and plans the
partition's next cleaning round with the engine (``cleaner.spark.plan``), whether or not it
is eligible now.

Then the two phases of ``cleaner.spark.phases`` run for every partition at once, as a dry
run: phase 1 aggregates key digest -> latest offset in Spark, giving each partition's
distinct keys (over the whole log) and its round's offset map; phase 2 rewrites every
group of every round against its keep-list into a scratch directory and measures it. So
the reclaimable bytes are exact: they are the bytes a clean's round frees, measured on the
very bytes it would write.

Columns beyond ``status``'s (which keep their names and meaning):

- ``sourceRoot``: the INPUT the partition's log dir was given as;
- ``distinctKeys``: distinct keys of the partition's data records (digests of every keyed
  record of a data batch, whole log; aborted transactional data included); null when a
  segment could not be read (a batch being appended by a live broker);
- ``offsetMapKeys``: keys in the next round's offset map (the dirty section's keys);
- ``roundEndOffset``, ``roundComplete``: where the next round ends; false when the
  single-node offset map would fill up first (a clean then needs more rounds, and the
  reclaimable bytes are those of the first one);
- ``reclaimableIfCleanedBytes``: log bytes the next round frees, eligible or not;
- ``reclaimableBytes``: what ``kafka-cleaner clean`` would free now: the same for an
  eligible partition, 0 for the others;
- ``bytesAfterClean``: ``sizeBytes`` minus the bytes the next round frees.

Retention (``cleanup.policy=compact,delete``) is not part of the reclaimable bytes.
"""

from __future__ import annotations

import time as _time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cleaner import cleaning
from cleaner.clock import SYSTEM_TIME, FixedTime, Time
from cleaner.config import Policy, parse_policy_text
from cleaner.deletion import DeletionCache
from cleaner.engine.next_clean import NextCleanCache
from cleaner.errors import KafkaCleanerError

from .phases import KeyScope, RoundsOutcome, run_rounds
from .plan import PartitionRef, SegmentRef, input_root, list_partitions, open_managed, plan_round

FORMATS = ("parquet", "csv", "json")

DEFAULT_POLICY = parse_policy_text("topics:\n  - match: '.*'\n    cleanupPolicy: compact\n")
"""Without ``--policy``: every topic, as if compacted with Kafka's defaults."""

STATUS_COLUMNS = (
    ("logDir", "string"),
    ("topic", "string"),
    ("partition", "int"),
    ("compacted", "boolean"),
    ("segments", "int"),
    ("sizeBytes", "long"),
    ("logStartOffset", "long"),
    ("logEndOffset", "long"),
    ("highWatermark", "long"),
    ("lastStableOffset", "long"),
    ("firstDirtyOffset", "long"),
    ("firstUncleanableOffset", "long"),
    ("cleanBytes", "long"),
    ("cleanableBytes", "long"),
    ("uncleanableBytes", "long"),
    ("cleanableRatio", "double"),
    ("minCleanableRatio", "double"),
    ("eligible", "boolean"),
    ("reason", "string"),
    ("uncleanableReason", "string"),
    ("compactionDelaySeconds", "double"),
    ("records", "long"),
    ("tombstones", "long"),
    ("oldestTombstoneAgeSeconds", "double"),
    ("pendingStartup", "array<string>"),
    (
        "lsoHolder",
        "struct<producerId: long, producerEpoch: int, firstOffset: long, startTimestampMs: long, ageSeconds: double>",
    ),
    ("clusterConfig", "boolean"),
    ("configSources", "map<string, string>"),
    ("configNotes", "array<string>"),
    (
        "nextClean",
        "struct<dirtyRecords: long, dirtyDistinctKeys: long, bytesFreed: long, kafkaPasses: int, passes: int,"
        " onePassDedupeBufferSize: long>",
    ),
    (
        "deletion",
        "struct<oldestSupersededAgeSeconds: double, oldestExpiredTombstoneAgeSeconds: double,"
        " supersededRecords: long, deadlineSeconds: double, breached: boolean, remainingSeconds: double,"
        " heldBackBy: string, bounded: boolean, computedAtMs: long>",
    ),
)
NESTED_COLUMNS = ("pendingStartup", "lsoHolder", "configSources", "configNotes", "nextClean", "deletion")
"""Columns CSV cannot hold as they are: written there as JSON text."""
REPORT_COLUMNS = (
    ("sourceRoot", "string"),
    *STATUS_COLUMNS,
    ("distinctKeys", "long"),
    ("offsetMapKeys", "long"),
    ("roundEndOffset", "long"),
    ("roundComplete", "boolean"),
    ("reclaimableIfCleanedBytes", "long"),
    ("reclaimableBytes", "long"),
    ("bytesAfterClean", "long"),
)


def partition_status(
    index: int, ref: PartitionRef, source_root: str, policy: Policy, now: int
) -> tuple[dict[str, Any], KeyScope | None]:
    """Stage 0 task: ``status``'s row of one partition and the scope phase 1 reads."""
    clock = FixedTime(now)
    local = ref.localized()  # an object-storage log dir: the partition mirrored on this host
    manager, managed = open_managed(local, policy, clock, read_only=True)
    deletion = DeletionCache.for_policy(policy)
    next_clean = NextCleanCache()
    statuses = cleaning.status([local.root], policy, clock, manager=manager, next_clean=next_clean, deletion=deletion)
    row = statuses[0].as_dict()
    row["sourceRoot"] = source_root
    if ref.in_object_storage:
        row["logDir"] = ref.root
    if row["reason"] == "uncleanable" or row["records"] is None:
        return row, None
    plan = None
    if managed.compacted:
        try:
            plan = plan_round(index, ref, manager, managed, policy, now, clock)
        except (KafkaCleanerError, OSError) as e:
            row["reason"], row["uncleanableReason"] = "uncleanable", f"{type(e).__name__}: {e}"
            return row, None
    the_log = managed.log
    segments = [SegmentRef(s.base_offset, s.size, s.last_modified_ms) for s in the_log.segments]
    return row, KeyScope(index, ref, managed.rule, the_log.log_start_offset, segments, True, plan)


def report(
    spark: Any,
    inputs: Sequence[str | Path],
    policy: Policy | None = None,
    *,
    now_ms: int | None = None,
    faults: Mapping[str, Any] | None = None,
    time: Time = SYSTEM_TIME,
) -> tuple[list[dict[str, Any]], RoundsOutcome, dict[str, float]]:
    """Every partition's row (``REPORT_COLUMNS``), the phases' outcome and timings."""
    policy = policy or DEFAULT_POLICY
    started = _time.perf_counter()
    given = {input_root(p): str(p) for p in inputs}
    refs = list_partitions(sorted(given), policy, compacted_only=False)
    now = now_ms if now_ms is not None else time.milliseconds()
    sc = spark.sparkContext
    seconds: dict[str, float] = {}
    staged = [(i, ref, given[ref.root]) for i, ref in enumerate(refs)]
    shared_policy = sc.broadcast(policy)
    results = (
        sc.parallelize(staged, max(1, min(len(staged), sc.defaultParallelism * 3)))
        .map(lambda t: partition_status(t[0], t[1], t[2], shared_policy.value, now))
        .collect()
        if staged
        else []
    )
    seconds["status"] = _time.perf_counter() - started
    scopes = [scope for _, scope in results if scope is not None]
    outcome = run_rounds(spark, scopes, run=None, faults=faults) if scopes else RoundsOutcome()
    seconds.update(outcome.seconds)
    rows = []
    plans = {s.index: s.round for s in scopes if s.round is not None}
    for index, (row, _) in enumerate(results):
        plan = plans.get(index)
        reclaim = None
        if plan is not None:
            groups = outcome.groups.get(index, [])
            reclaim = sum(g["sourceBytes"] - g["cleanedBytes"] for g in groups)
        elif row["reason"] != "uncleanable" and row["compacted"]:
            reclaim = 0
        row.update(
            distinctKeys=outcome.distinct_keys.get(index),
            offsetMapKeys=outcome.map_keys.get(index) if plan is not None else None,
            roundEndOffset=plan.end_offset if plan is not None else None,
            roundComplete=(plan.map_stop_offset is None) if plan is not None else None,
            reclaimableIfCleanedBytes=reclaim,
            reclaimableBytes=(reclaim if row["eligible"] else 0) if reclaim is not None else None,
            bytesAfterClean=row["sizeBytes"] - reclaim if reclaim is not None else None,
        )
        rows.append({name: row.get(name) for name, _ in REPORT_COLUMNS})
    seconds["total"] = _time.perf_counter() - started
    return rows, outcome, seconds


def dataframes(spark: Any, rows: list[dict[str, Any]]) -> tuple[Any, Any]:
    """The partitions DataFrame and its per-topic rollup."""
    from pyspark.sql import functions as F

    schema = ", ".join(f"{name} {kind}" for name, kind in REPORT_COLUMNS)
    partitions = spark.createDataFrame([tuple(r[name] for name, _ in REPORT_COLUMNS) for r in rows], schema)
    topics = (
        partitions.groupBy("topic")
        .agg(
            F.count(F.lit(1)).alias("partitions"),
            F.countDistinct("sourceRoot").alias("sourceRoots"),
            F.sum("segments").alias("segments"),
            F.sum("sizeBytes").alias("sizeBytes"),
            F.sum("cleanBytes").alias("cleanBytes"),
            F.sum("cleanableBytes").alias("cleanableBytes"),
            F.sum("uncleanableBytes").alias("uncleanableBytes"),
            F.sum(F.col("eligible").cast("int")).alias("eligiblePartitions"),
            F.sum("records").alias("records"),
            F.sum("tombstones").alias("tombstones"),
            F.max("oldestTombstoneAgeSeconds").alias("oldestTombstoneAgeSeconds"),
            F.max("compactionDelaySeconds").alias("maxCompactionDelaySeconds"),
            F.sum("distinctKeys").alias("distinctKeys"),
            F.sum("reclaimableIfCleanedBytes").alias("reclaimableIfCleanedBytes"),
            F.sum("reclaimableBytes").alias("reclaimableBytes"),
        )
        .withColumn(
            "cleanableRatio",
            F.when(
                (F.col("cleanBytes") + F.col("cleanableBytes")) > 0,
                F.col("cleanableBytes") / (F.col("cleanBytes") + F.col("cleanableBytes")),
            ).otherwise(F.lit(0.0)),
        )
        .orderBy("topic")
    )
    return partitions.orderBy("sourceRoot", "topic", "partition"), topics


def write(partitions: Any, topics: Any, output: str | Path, fmt: str) -> dict[str, str]:
    """``<output>/partitions`` and ``<output>/topics``, one file each, replaced. ``output`` is
    any path Spark writes to (a directory, ``s3a://bucket/prefix``, ...)."""
    from pyspark.sql import functions as F

    if fmt not in FORMATS:
        raise KafkaCleanerError(f"--format must be one of {', '.join(FORMATS)}")
    if fmt == "csv":  # CSV has no arrays, maps or structs
        for name in NESTED_COLUMNS:
            partitions = partitions.withColumn(name, F.to_json(name))
    out = {}
    for name, df in (("partitions", partitions), ("topics", topics)):
        path = f"{str(output).rstrip('/')}/{name}"
        writer = df.coalesce(1).write.mode("overwrite").format(fmt)
        if fmt == "csv":
            writer = writer.option("header", "true")
        writer.save(path)
        out[name] = path
    return out
