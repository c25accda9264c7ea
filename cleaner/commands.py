"""``kafka-cleaner clean``, ``run`` and ``status``: the cleaner's own commands.

Exit codes (scripts depend on them): 0 all went well, 2 usage or policy error, 3 some
partition became uncleanable (each named on stderr with its reason), 4 a log dir is
locked by another process (a running broker).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from cleaner import cleaning
from cleaner.clock import SYSTEM_TIME, FixedTime, Time
from cleaner.config import Mode, Policy, load_policy
from cleaner.engine.log_cleaner import LogCleaner
from cleaner.engine.manager import LogCleanerManager
from cleaner.engine.next_clean import NextCleanCache
from cleaner.errors import KafkaCleanerError, LogDirLockedError, PolicyError
from cleaner.sidecar.guards import refusal_lines
from cleaner.storage.log_dir import LogDirectory, is_kafka_log_dir
from cleaner.storage.topic_partition import parse_partition_dir

EXIT_OK, EXIT_USAGE, EXIT_UNCLEANABLE, EXIT_LOCKED = 0, 2, 3, 4

def _kafka_log_dirs(ctx: click.Context, param: click.Parameter, paths: tuple[Path, ...]) -> tuple[Path, ...]:
    """Only what Kafka itself would take for a log dir (``is_kafka_log_dir``): no command
    scans, locks or writes anything else."""
    for path in paths:
        if is_kafka_log_dir(path):
            continue
        if parse_partition_dir(path.name) is not None and is_kafka_log_dir(path.parent):
            raise click.BadParameter(f"{path} is a partition dir; give its log dir: {path.parent}")
        raise click.BadParameter(
            f"{path} is not a Kafka log dir: it has no meta.properties, nor Kafka's offset checkpoint "
            "files next to partition dirs"
        )
    return paths


log_dir_argument = click.argument(
    "data_dir",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    callback=_kafka_log_dirs,
)
policy_option = click.option(
    "--policy",
    "policy_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Policy file: a CompactionPolicy manifest or just its spec (YAML).",
)
now_option = click.option(
    "--now-ms",
    type=int,
    default=None,
    help="Fix the clock (epoch ms) for delete horizons, compaction lags and producer expiry.",
)


def load_policy_or_exit(policy_path: Path) -> Policy:
    try:
        return load_policy(policy_path)
    except PolicyError as e:
        click.echo(f"kafka-cleaner: invalid policy: {e}", err=True)
        sys.exit(EXIT_USAGE)


def clock_for(now_ms: int | None) -> Time:
    """``--now-ms`` pins the wall clock every rule reads (horizons, lags, producer expiry)."""
    return FixedTime(now_ms) if now_ms is not None else SYSTEM_TIME


@contextlib.contextmanager
def exit_codes_for_errors() -> Iterator[None]:
    """A refused log dir lock exits 4; any other of our errors (bad input named with its file
    and reason) exits 2, with the message on stderr and no traceback."""
    try:
        yield
    except LogDirLockedError as e:
        click.echo(f"kafka-cleaner: {e}", err=True)
        sys.exit(EXIT_LOCKED)
    except KafkaCleanerError as e:
        click.echo(f"kafka-cleaner: {e}", err=True)
        sys.exit(EXIT_USAGE)


def _mb(n: float) -> str:
    return f"{n / 1048576:,.1f} MiB"


@click.command("clean")
@log_dir_argument
@policy_option
@now_option
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Cleaner threads (default: the policy's).")
@click.option("--json", "as_json", is_flag=True, help="Print per-partition stats as JSON.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="error",
    show_default=True,
    help="The cleaner's log on stderr (failed partitions are listed at the end whatever the level).",
)
@click.option(
    "--force-mode",
    is_flag=True,
    help="Clean even though the policy's mode is observe or stage (clean always compacts in place).",
)
def clean_command(
    data_dir: tuple[Path, ...],
    policy_path: Path,
    now_ms: int | None,
    threads: int | None,
    as_json: bool,
    log_level: str,
    force_mode: bool,
) -> None:
    """Clean Kafka log dirs until no partition is eligible, then exit.

    Takes each log dir's .lock like a broker does, so it refuses a directory that a
    running broker holds (exit 4). Exit 3 if some partition became uncleanable.
    """
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    policy = load_policy_or_exit(policy_path)
    if policy.mode != Mode.COMPACT and not force_mode:
        click.echo(
            f"kafka-cleaner: the policy's mode is {policy.mode} (a policy without `mode` observes), and "
            f"clean compacts in place; set `mode: compact` in {policy_path}, or pass --force-mode",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    time = clock_for(now_ms)
    console = Console(stderr=True)
    stop = threading.Event()
    caught = _on_signals(stop)
    progress = None
    meter = None
    if console.is_terminal and not as_json:
        progress = Progress(
            TextColumn("cleaning"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        total = _estimated_work(data_dir, policy, time)
        task = progress.add_task("clean", total=total or None)

        def meter(n: int) -> None:
            progress.advance(task, n)

    with exit_codes_for_errors():
        if progress is not None:
            with progress:
                outcome = cleaning.clean(data_dir, policy, time, threads=threads, io_meter=meter, stop=stop)
        else:
            outcome = cleaning.clean(data_dir, policy, time, threads=threads, stop=stop)
    if as_json:
        click.echo(json.dumps(_outcome_json(outcome), indent=2))
    else:
        _print_outcome(outcome)
    for log_dir, tps in outcome.uncleanable.items():
        for tp, reason in tps.items():
            click.echo(f"kafka-cleaner: partition {tp} in {log_dir} is uncleanable: {reason}", err=True)
    if caught:
        signum = caught[0]
        pending = ", ".join(str(tp) for tp in outcome.still_eligible) or "none"
        click.echo(
            f"kafka-cleaner: interrupted by {signal.Signals(signum).name}: {len(outcome.results)} clean(s) "
            f"completed{'; the rounds in flight were aborted, their files removed' if outcome.interrupted else ''}; "
            f"still eligible: {pending}",
            err=True,
        )
        sys.exit(128 + signum)  # 130 for SIGINT, 143 for SIGTERM, as shells report them
    sys.exit(EXIT_UNCLEANABLE if outcome.uncleanable else EXIT_OK)


def _estimated_work(paths, policy: Policy, time: Time) -> int:
    """Bytes a clean will read: for each eligible log its dirty section (map) plus every
    segment below the first uncleanable offset (rewrite), plus what it writes."""
    total = 0
    for status in cleaning.status(paths, policy, time):
        r = status.report
        if r.eligible:
            total += r.cleanable_bytes + r.clean_bytes + r.cleanable_bytes
    return total


def _outcome_json(outcome: cleaning.CleanOutcome) -> dict:
    return {
        "elapsedSeconds": round(outcome.elapsed_seconds, 3),
        "bytesBefore": outcome.bytes_before,
        "bytesAfter": outcome.bytes_after,
        "cleans": [
            {
                "topic": r.topic_partition.topic,
                "partition": r.topic_partition.partition,
                "logDir": r.log_dir,
                "firstDirtyOffset": r.first_dirty_offset,
                "endOffset": r.end_offset,
                **r.stats.as_dict(),
            }
            for r in outcome.results
        ],
        "uncleanable": [
            {"logDir": d, "topic": tp.topic, "partition": tp.partition, "reason": reason}
            for d, tps in outcome.uncleanable.items()
            for tp, reason in tps.items()
        ],
    }


def _print_outcome(outcome: cleaning.CleanOutcome) -> None:
    console = Console()
    table = Table(title="kafka-cleaner clean")
    for col in ("partition", "dirty section", "read", "written", "records", "removed", "seconds"):
        table.add_column(col, justify="right" if col not in ("partition",) else "left")
    for r in outcome.results:
        s = r.stats
        table.add_row(
            str(r.topic_partition),
            f"[{r.first_dirty_offset}, {r.end_offset})",
            _mb(s.bytes_read),
            _mb(s.bytes_written),
            f"{s.messages_read:,} -> {s.messages_written:,}",
            f"{s.records_removed:,}",
            f"{s.elapsed_secs:.2f}",
        )
    console.print(table)
    read = sum(r.stats.bytes_read for r in outcome.results)
    rate = read / outcome.elapsed_seconds / 1048576 if outcome.elapsed_seconds else 0.0
    console.print(
        f"{len(outcome.results)} clean(s); {_mb(outcome.bytes_before)} -> {_mb(outcome.bytes_after)} in "
        f"{outcome.elapsed_seconds:.2f} s of wall time ({rate:,.1f} MiB/s of log read by the cleans)"
    )


def _on_signals(stop: threading.Event) -> list[int]:
    """SIGTERM and SIGINT set ``stop``; the returned list receives the signals caught."""
    caught: list[int] = []

    def handler(signum, frame) -> None:
        caught.append(signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return caught


@click.command("run")
@log_dir_argument
@policy_option
def run_command(data_dir: tuple[Path, ...], policy_path: Path) -> None:
    """Run the cleaner threads (with backoff) until SIGTERM/SIGINT, then shut down
    gracefully: in-flight cleans abort and leave no temporary files."""
    policy = load_policy_or_exit(policy_path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log_dirs = [LogDirectory(p) for p in data_dir]
    stop = threading.Event()
    _on_signals(stop)
    with exit_codes_for_errors(), cleaning.locked(log_dirs):
        manager = LogCleanerManager(log_dirs, policy, SYSTEM_TIME)
        pool = LogCleaner(manager, policy.cleaner, SYSTEM_TIME)
        pool.start()
        try:
            while not stop.wait(1.0):
                restarted = pool.restart_dead_threads()
                if restarted:
                    logging.getLogger("cleaner").warning("restarted %d dead cleaner thread(s)", restarted)
        finally:
            pool.shutdown()


@click.command("status")
@log_dir_argument
@policy_option
@now_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status_command(data_dir: tuple[Path, ...], policy_path: Path, now_ms: int | None, as_json: bool) -> None:
    """Per partition: first dirty offset, clean/cleanable/uncleanable bytes, cleanable
    ratio, eligible now or why not, compaction delay, tombstones and the oldest one's
    age. Read-only: safe next to a live broker."""
    policy = load_policy_or_exit(policy_path)
    statuses = cleaning.status(data_dir, policy, clock_for(now_ms), next_clean=NextCleanCache())
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in statuses], indent=2))
        return
    table = Table(title="kafka-cleaner status")
    for col in (
        "partition",
        "segments",
        "size",
        "first dirty",
        "clean",
        "cleanable",
        "uncleanable",
        "ratio",
        "eligible",
        "delay s",
        "tombstones",
        "oldest tomb. age s",
    ):
        table.add_column(col, justify="left" if col in ("partition", "eligible") else "right")
    for s in statuses:
        r = s.report
        age = s.oldest_tombstone_age_ms
        table.add_row(
            str(r.topic_partition),
            str(r.segments),
            _mb(r.size_bytes),
            str(r.first_dirty_offset),
            _mb(r.clean_bytes),
            _mb(r.cleanable_bytes),
            _mb(r.uncleanable_bytes),
            f"{r.cleanable_ratio:.2f}",
            "yes" if r.eligible else f"no ({r.reason}{': ' + r.uncleanable_reason if r.uncleanable_reason else ''})",
            f"{r.compaction_delay_ms / 1000:.0f}",
            str(s.facts.tombstones) if s.facts else "?",
            f"{age / 1000:.0f}" if age is not None else "-",
        )
    Console().print(table)
    if policy.mode is Mode.STAGE:  # what stage mode does with each partition, refusals with their reason
        for line in refusal_lines([Path(d) for d in data_dir], policy):
            click.echo(f"stage: {line}")
