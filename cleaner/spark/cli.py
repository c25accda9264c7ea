"""``kafka-cleaner spark report|compact|compact-large``.

Exit codes as ``kafka-cleaner clean``'s: 0 ok, 2 usage or policy error, 3 some partition
uncleanable, 4 a log dir locked by another process (a running broker).
``KAFKA_CLEANER_SPARK_FAULTS`` (JSON, see ``cleaner.spark.staging.maybe_fail``) injects
failures for tests of the exactly-once protocol.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from cleaner.commands import (
    EXIT_OK,
    EXIT_UNCLEANABLE,
    EXIT_USAGE,
    clock_for,
    exit_codes_for_errors,
    load_policy_or_exit,
    now_option,
    policy_option,
)
from cleaner.output import Bytes, Column, binary_bytes, print_table, resolve_format

from .object_store import is_object_uri
from .report import FORMATS

FAULTS_ENV = "KAFKA_CLEANER_SPARK_FAULTS"

master_option = click.option(
    "--master",
    default=None,
    help="Spark master (default: the spark-submit one, else $KAFKA_CLEANER_SPARK_MASTER, else local[*]).",
)
output_dir_option = click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Copy-on-write: write the cleaned partitions under this directory; the input is only read.",
)
staging_option = click.option(
    "--staging",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where runs keep their staged work (default: <output>/.kafka-cleaner-spark, or beside the input log dir).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


class LogDirInput(click.ParamType):
    """An INPUT log dir: an existing directory, or one in S3-compatible object storage
    (``s3://bucket/prefix``, ``s3a://`` too; read through boto3's environment, see
    ``cleaner.spark.object_store``)."""

    name = "LOG_DIR"
    local = click.Path(exists=True, file_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        if is_object_uri(value):
            return str(value)
        return self.local.convert(value, param, ctx)


log_dir_inputs = click.argument("inputs", nargs=-1, required=True, type=LogDirInput())


class PartitionInput(LogDirInput):
    """``compact-large``'s PARTITION: a partition directory, or one of a log dir in object
    storage (``s3://bucket/prefix/<topic>-<partition>``)."""

    name = "PARTITION_DIR"


class OutputLocation(LogDirInput):
    """``compact``'s --output: a directory (made if missing), or a prefix in S3-compatible
    object storage (``cleaner.spark.object_output``)."""

    name = "DIR|s3://BUCKET/PREFIX"
    local = click.Path(file_okay=False, path_type=Path)


def _faults() -> dict[str, Any] | None:
    text = os.environ.get(FAULTS_ENV)
    return json.loads(text) if text else None


def _session(master: str | None) -> Any:
    try:
        from .session import spark_session
    except ImportError:  # pragma: no cover - pyspark is an extra
        click.echo(
            "kafka-cleaner: the spark commands need pyspark: pip install '.[spark]' in this repository "
            "(make setup does)",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    return spark_session(master)


def _run_job(
    job: Callable[..., Any],
    target: Any,
    policy_path: Path,
    output: Path | str | None,
    now_ms: int | None,
    staging: Path | None,
    master: str | None,
    **options: Any,
) -> Any:
    """A compacting job on ``target`` with the options both compact commands share."""
    policy = load_policy_or_exit(policy_path)
    spark = _session(master)
    with exit_codes_for_errors():
        time = clock_for(now_ms)
        return job(spark, target, policy, output=output, now_ms=now_ms, staging=staging, faults=_faults(), time=time,
                   **options)  # fmt: skip


@click.group("spark")
def spark_group() -> None:
    """Scale-out on Apache Spark: fleet reports, many partitions in parallel, one huge
    partition in two phases. The same code runs embedded (local[*]) or under spark-submit."""


@spark_group.command("report")
@log_dir_inputs
@click.option("--output", required=True, help="Report directory: a path, or any URI Spark writes to (s3a://...).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="parquet", show_default=True)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Policy file (default: every topic, compacted with Kafka's defaults).",
)
@now_option
@master_option
def report_command(
    inputs: tuple[Path | str, ...],
    output: str,
    fmt: str,
    policy_path: Path | None,
    now_ms: int | None,
    master: str | None,
) -> None:
    """Read-only report of Kafka log dirs: one row per partition (what `kafka-cleaner
    status` shows, plus exact distinct keys and reclaimable bytes) and a per-topic rollup,
    written to OUTPUT/partitions and OUTPUT/topics. An INPUT may be a log dir in
    S3-compatible object storage (s3://bucket/prefix)."""
    from .report import dataframes, report, write

    policy = load_policy_or_exit(policy_path) if policy_path is not None else None
    spark = _session(master)
    with exit_codes_for_errors():
        rows, _, seconds = report(spark, inputs, policy, now_ms=now_ms, faults=_faults(), time=clock_for(now_ms))
    partitions, topics = dataframes(spark, rows)
    paths = write(partitions, topics, output, fmt)
    reclaim = sum(r["reclaimableBytes"] or 0 for r in rows)
    click.echo(
        f"{len(rows)} partition(s), {binary_bytes(sum(r['sizeBytes'] or 0 for r in rows))}, "
        f"{binary_bytes(reclaim)} reclaimable now; {seconds['total']:.1f} s -> {paths['partitions']}, {paths['topics']}"
    )


@spark_group.command("compact")
@log_dir_inputs
@policy_option
@click.option(
    "--output",
    type=OutputLocation(),
    default=None,
    help="Copy-on-write: write the cleaned log dirs under this directory or object-storage prefix "
    "(s3://bucket/prefix, marked whole by its _SUCCESS object; needs --staging); the input is only read.",
)
@now_option
@staging_option
@master_option
@json_option
def compact_command(
    inputs: tuple[Path | str, ...],
    policy_path: Path,
    output: Path | str | None,
    now_ms: int | None,
    staging: Path | None,
    master: str | None,
    as_json: bool,
) -> None:
    """Clean every eligible partition of the log dirs, one Spark task per partition, each
    running the engine unchanged. With --output the cleaned partitions are written under
    OUTPUT/<log dir name>/ and the input is only read; without it they are cleaned in place
    (a path every executor sees; refused while a broker holds a log dir's .lock). An INPUT
    may be a log dir in S3-compatible object storage (s3://bucket/prefix), cleaned with
    --output, which may be in object storage too."""
    from .compact import compact

    result = _run_job(compact, inputs, policy_path, output, now_ms, staging, master)
    rows = result.rows()
    if as_json:
        click.echo(json.dumps({"runId": result.run_id, "status": result.status, "partitions": rows}, indent=2))
    else:
        columns = [Column("partition"), Column("action")] + [
            Column(name, right=True)
            for name in ("rounds", "size before", "size after", "records read", "records written", "seconds")
        ]
        cells = [
            [
                f"{r['sourceRoot']}:{r['topic']}-{r['partition']}",
                r["action"] or "",
                r["rounds"],
                Bytes(r["bytesBefore"]),
                Bytes(r["bytesAfter"]),
                r["recordsRead"],
                r["recordsWritten"],
                f"{r['seconds'] or 0:.2f}",
            ]
            for r in rows
        ]
        title = f"kafka-cleaner spark compact ({result.status}, run {result.run_id})"
        print_table(resolve_format(None, False), title, columns, cells)
    for p in result.uncleanable:
        click.echo(
            f"kafka-cleaner: partition {p['topic']}-{p['partition']} in {p['root']} is uncleanable: {p['uncleanable']}",
            err=True,
        )
    sys.exit(EXIT_UNCLEANABLE if result.uncleanable else EXIT_OK)


@spark_group.command("compact-large")
@click.argument("partition_dir", type=PartitionInput())
@policy_option
@output_dir_option
@now_option
@staging_option
@master_option
@click.option("--max-rounds", type=click.IntRange(min=1), default=None,
              help="Stop after this many rounds (default: while the partition is eligible, as clean does).")
@json_option
def compact_large_command(
    partition_dir: Path | str,
    policy_path: Path,
    output: Path | None,
    now_ms: int | None,
    staging: Path | None,
    master: str | None,
    max_rounds: int | None,
    as_json: bool,
) -> None:
    """Cleaning rounds of one huge partition, each in two distributed phases (offset map,
    then the segment groups) committed with Kafka's swap protocol, until it is no longer
    eligible: a round ends early where the offset map fills up, and the next one goes on
    from there. With --output the cleaned partition is written to OUTPUT/<partition> (OUTPUT
    is a log dir) and the later rounds run there; without it the partition is cleaned in
    place. PARTITION_DIR may be in S3-compatible object storage
    (s3://bucket/prefix/<topic>-<partition>), cleaned with --output: the driver downloads
    each segment's head and tail only."""
    from .compact_large import compact_large

    outcome = _run_job(compact_large, partition_dir, policy_path, output, now_ms, staging, master,
                       max_rounds=max_rounds)  # fmt: skip
    summary = outcome.as_dict()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for n, r in enumerate(summary["rounds"], 1):
        click.echo(
            f"round {n}: {r['status']} (run {r['runId']}); dirty section "
            f"[{r['firstDirtyOffset']}, {r['endOffset']}), {r['groups']} group(s), "
            f"{binary_bytes(r['bytesBefore'])} -> {binary_bytes(r['bytesAfter'])}; "
            + ", ".join(f"{phase} {secs:.2f} s" for phase, secs in r["seconds"].items())
        )
    click.echo(
        f"{summary['partition']}: {summary['status']}, {len(summary['rounds'])} round(s), clean up to "
        f"{summary['endOffset']}; .log bytes {binary_bytes(summary['sizeBefore'])} -> "
        f"{binary_bytes(summary['sizeAfter'])}"
    )
