"""``kafka-cleaner clean``, ``run`` and ``status``: the cleaner's own commands.

Exit codes (scripts depend on them): 0 all went well, 1 ``status --fail-on`` matched,
2 usage or policy error, 3 some partition became uncleanable (each named on stderr with its
reason), 4 a log dir is locked by another process (a running broker), 130/143 ``clean``
interrupted by SIGINT/SIGTERM (what was done and what was not is printed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import click

from cleaner import cleaning, log_format
from cleaner.clock import SYSTEM_TIME, FixedTime, Time
from cleaner.config import Mode, Policy, load_policy
from cleaner.deletion import DeletionCache
from cleaner.engine.log_cleaner import CleanResult, LogCleaner
from cleaner.engine.manager import LogCleanerManager, PartitionReport
from cleaner.engine.next_clean import NextCleanCache
from cleaner.errors import KafkaCleanerError, LogDirLockedError, PolicyError
from cleaner.output import (
    ByteProgress,
    Bytes,
    Column,
    Duration,
    binary_bytes,
    output_option,
    print_table,
    resolve_format,
)
from cleaner.partition_filter import PartitionFilter, filter_options, glob_meant, partition_filter, unmatched
from cleaner.sidecar import stage
from cleaner.sidecar.guards import refusal_lines
from cleaner.sidecar.logdirs import duplicate_partitions
from cleaner.storage.log_dir import LogDirectory, is_kafka_log_dir
from cleaner.storage.topic_partition import TopicPartition, parse_partition_dir

EXIT_OK, EXIT_FAIL_ON, EXIT_USAGE, EXIT_UNCLEANABLE, EXIT_LOCKED = 0, 1, 2, 3, 4


def _kafka_log_dirs(ctx: click.Context, param: click.Parameter, paths: tuple[Path, ...]) -> tuple[Path, ...]:
    """Only what Kafka itself would take for a log dir (``is_kafka_log_dir``): no command
    scans, locks or writes anything else. Then ``distinct_log_dirs``."""
    for path in paths:
        if is_kafka_log_dir(path):
            continue
        if parse_partition_dir(path.name) is not None and is_kafka_log_dir(path.parent):
            raise click.BadParameter(f"{path} is a partition dir; give its log dir: {path.parent}")
        raise click.BadParameter(
            f"{path} is not a Kafka log dir: it has no meta.properties, nor Kafka's offset checkpoint "
            "files next to partition dirs"
        )
    try:
        return distinct_log_dirs(paths)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def distinct_log_dirs(paths: Sequence[Path]) -> tuple[Path, ...]:
    """``paths`` with each directory once (the same dir given twice, or under another name
    through a symlink, is one log dir: a shell glob and an explicit path may well overlap).
    A partition found in two of them raises ``ValueError``: Kafka refuses to start on such
    a broker, and, as the sidecar does, neither copy is touched."""
    unique: dict[Path, Path] = {}
    for path in paths:
        unique.setdefault(path.resolve(), path)
    doubled = duplicate_partitions(list(unique))
    if doubled:
        lines = [f"  {tp}: {', '.join(map(str, where))}" for tp, where in sorted(doubled.items(), key=str)]
        raise ValueError(
            f"{len(doubled)} partition(s) are in more than one log dir; Kafka refuses to start on this "
            "(keep one copy), and nothing was touched:\n" + "\n".join(lines)
        )
    return tuple(unique.values())


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
MIN_NOW_MS, MAX_NOW_MS = 10**12, 10**13
"""``--now-ms`` must be epoch milliseconds of this era: 10^12 ms is 2001-09-09 and 10^13 ms is
2286-11-20. Below, the value is most likely seconds (any date in seconds is below 10^12
until the year 33658), which would put every delete horizon in 1970 and let the next clean
drop the tombstones at once; above, it is most likely micro- or nanoseconds."""


def check_now_ms(ctx: click.Context | None, param: click.Parameter | None, value: int | None) -> int | None:
    """Refuses a ``--now-ms`` that cannot be milliseconds of this era (``MIN_NOW_MS``)."""
    if value is None or MIN_NOW_MS <= value < MAX_NOW_MS:
        return value
    if 0 <= value < MIN_NOW_MS:
        why = f"it is before 2001-09-09 in milliseconds; seconds? then give {value * 1000}"
    elif value >= MAX_NOW_MS:
        why = "it is after the year 2286 in milliseconds; micro- or nanoseconds?"
    else:
        why = "it is before 1970"
    raise click.BadParameter(
        f"{value} is not epoch milliseconds of this era ({why}): delete horizons, compaction lags and producer "
        f"expiry are computed from it; give a value from {MIN_NOW_MS} (2001-09-09) to {MAX_NOW_MS - 1} (2286-11-20)",
        param_hint="--now-ms",
    )


now_option = click.option(
    "--now-ms",
    type=int,
    default=None,
    callback=check_now_ms,
    metavar="MS",
    help="Fix the clock (epoch milliseconds, 13 digits) for delete horizons, compaction lags and producer expiry.",
)
threads_option = click.option(
    "--threads", type=click.IntRange(min=1), default=None, help="Cleaner threads (default: the policy's)."
)
force_mode_option = click.option(
    "--force-mode",
    is_flag=True,
    help="Compact even though the policy's mode is observe or stage (the mode is what the sidecar obeys).",
)


def require_compact_mode(policy: Policy, policy_path: Path, force_mode: bool, command: str) -> None:
    """Only a policy whose ``mode`` is ``compact`` lets a command compact in place."""
    if policy.mode is Mode.COMPACT or force_mode:
        return
    click.echo(
        f"kafka-cleaner: the policy's mode is {policy.mode} (a policy without `mode` observes), and "
        f"{command} compacts in place; set `mode: compact` in {policy_path}, or pass --force-mode",
        err=True,
    )
    sys.exit(EXIT_USAGE)


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


def why_not(r: PartitionReport) -> str:
    """Why a partition is held back, as a sentence with its numbers."""
    if r.reason == "ratio":
        return f"cleanable ratio {r.cleanable_ratio:.2f} is not above min.cleanable.dirty.ratio {r.min_cleanable_ratio}"
    if r.reason == "activeSegment":
        return "nothing to clean below the active segment (Kafka never cleans the active segment)"
    if r.reason == "lso":
        holder = r.lso_holder
        by = f" (producer {holder.producer_id} since offset {holder.first_offset})" if holder else ""
        return f"an open transaction holds the last stable offset at {r.last_stable_offset}{by}"
    if r.reason == "lag":
        return "its dirty records are younger than min.compaction.lag.ms"
    if r.reason == "uncleanable":
        return f"uncleanable: {r.uncleanable_reason}"
    if r.reason == "notCompacted":
        return "its rule's cleanup.policy is not compact"
    return r.reason or "eligible"


def _topics(paths: Sequence[Path]) -> list[str]:
    return sorted({tp.topic for p in paths for tp in LogDirectory(p, read_only=True).partition_dirs()})


def warn_unmatched_filters(paths: Sequence[Path], policy: Policy, topic: str | None) -> None:
    """On stderr: a ``--topic`` that matches no topic in the log dirs, and a rule's ``match``
    that matches none while it would as a shell glob (``orders-*``); a rule that matches
    nothing otherwise is left alone (one policy may serve brokers holding other topics)."""
    topics = _topics(paths)
    warnings = [unmatched("--topic", topic, topics)] if topic is not None else []
    for i, rule in enumerate(policy.topics):
        meant = glob_meant(rule.match, topics)
        if meant is not None:
            warnings.append(
                f"the policy's topics[{i}].match '{rule.match}' matches no topic here: it is a regular expression, "
                f"matched against the whole topic name; '{meant}' would match (as the glob '{rule.match}' does)"
            )
    for warning in warnings:
        if warning is not None:
            click.echo(f"kafka-cleaner: warning: {warning}", err=True)


def no_partitions_message(paths: Sequence[Path], policy: Policy, filtered: bool) -> str:
    """Why a command found nothing to work on: the policy's rules against the topics seen."""
    topics = _topics(paths)
    rules = ", ".join(rule.match for rule in policy.topics) or "none"
    if topics:
        seen = f"{len(topics)} topic(s) seen: {', '.join(topics[:10])}" + (", ..." if len(topics) > 10 else "")
    else:
        seen = "no partition directory in these log dirs"
    if filtered:
        return f"no partition matched: --topic/--partition select none of those the rules ({rules}) match ({seen})"
    return f"no partition matched: the policy's rules ({rules}) match none of them ({seen})"


@click.command("clean")
@log_dir_argument
@policy_option
@now_option
@threads_option
@filter_options
@force_mode_option
@click.option(
    "--dry-run",
    is_flag=True,
    help="Read what the next clean of each eligible partition would read and say what it would remove; "
    "nothing is locked or written.",
)
@output_option
@click.option("--no-progress", is_flag=True, help="No progress bar (there is none when stderr is not a terminal).")
@click.option(
    "--log-level",
    type=click.Choice(log_format.LEVELS),
    default="error",
    show_default=True,
    help="The cleaner's log on stderr (failed partitions are listed at the end whatever the level).",
)
def clean_command(
    data_dir: tuple[Path, ...],
    policy_path: Path,
    now_ms: int | None,
    threads: int | None,
    topic: str | None,
    partitions: tuple[int, ...],
    force_mode: bool,
    dry_run: bool,
    output: str | None,
    as_json: bool,
    no_progress: bool,
    log_level: str,
) -> None:
    """Clean Kafka log dirs until no partition is eligible, then exit.

    Takes each log dir's .lock like a broker does, so it refuses a directory that a
    running broker holds (exit 4). Exit 3 if some partition became uncleanable; 130/143
    when interrupted by SIGINT/SIGTERM (completed cleans stand, in-flight ones are undone).
    """
    log_format.configure(log_level)
    policy = load_policy_or_exit(policy_path)
    if not dry_run:
        require_compact_mode(policy, policy_path, force_mode, "clean")
    fmt = resolve_format(output, as_json)
    only = partition_filter(topic, partitions)
    time = clock_for(now_ms)
    warn_unmatched_filters(data_dir, policy, topic)
    with exit_codes_for_errors():
        reports = cleaning.reports(data_dir, policy, time, only=only)
    if not reports:
        click.echo(f"kafka-cleaner: {no_partitions_message(data_dir, policy, only is not None)}", err=True)
        sys.exit(EXIT_OK)
    eligible = [r for r in reports if r.eligible]
    if dry_run:
        _dry_run(data_dir, policy, time, only, eligible, fmt)
        return
    if not eligible:
        click.echo("kafka-cleaner: nothing to clean; no partition is eligible:", err=True)
        for r in reports:
            click.echo(f"  {r.topic_partition}: {why_not(r)}", err=True)
    stop = threading.Event()
    caught = _on_signals(stop)
    # The cleaner's io meter sees every byte read (the map pass over the dirty section,
    # the copy pass over every segment below the first uncleanable offset) and written.
    bar = ByteProgress(
        "cleaning (bytes read and written)",
        sum(r.cleanable_bytes + 2 * (r.clean_bytes + r.cleanable_bytes) for r in eligible),
        enabled=not no_progress and fmt != "json",
    )
    with exit_codes_for_errors(), bar.shown_while():
        outcome = cleaning.clean(data_dir, policy, time, threads=threads, io_meter=bar.advance, stop=stop, only=only)
    if fmt == "json":
        click.echo(json.dumps(_outcome_json(outcome, len(eligible)), indent=2))
    else:
        _print_outcome(outcome, fmt)
        _print_summary(outcome, len(eligible), fmt)
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


def _bytes_read(outcome: cleaning.CleanOutcome) -> int:
    return sum(r.stats.bytes_read + r.stats.map_bytes_read for r in outcome.results)


def _outcome_json(outcome: cleaning.CleanOutcome, eligible: int) -> dict:
    return {
        "elapsedSeconds": round(outcome.elapsed_seconds, 3),
        "interrupted": outcome.interrupted,
        "eligibleAtStart": eligible,
        "bytesBefore": outcome.bytes_before,
        "bytesAfter": outcome.bytes_after,
        "bytesRead": _bytes_read(outcome),
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
        "stillEligible": [{"topic": tp.topic, "partition": tp.partition} for tp in outcome.still_eligible],
        "uncleanable": [
            {"logDir": d, "topic": tp.topic, "partition": tp.partition, "reason": reason}
            for d, tps in outcome.uncleanable.items()
            for tp, reason in tps.items()
        ],
    }


_CLEAN_COLUMNS = [  # drop: on a narrow terminal, the highest goes first
    Column("partition"),
    Column("dirty section", drop=3),
    Column("read", right=True, drop=2),
    Column("written", right=True),
    Column("records read", right=True, drop=5),
    Column("records written", right=True, drop=4),
    Column("removed", right=True),
    Column("seconds", right=True, drop=1),
]


def _print_outcome(outcome: cleaning.CleanOutcome, fmt: str) -> None:
    if not outcome.results:
        return
    rows = [
        [
            str(r.topic_partition),
            f"[{r.first_dirty_offset}, {r.end_offset})",
            Bytes(r.stats.bytes_read),
            Bytes(r.stats.bytes_written),
            r.stats.messages_read,
            r.stats.messages_written,
            r.stats.records_removed,
            f"{r.stats.elapsed_secs:.2f}",
        ]
        for r in outcome.results
    ]
    print_table(fmt, "kafka-cleaner clean", _CLEAN_COLUMNS, rows)


def _print_summary(outcome: cleaning.CleanOutcome, eligible: int, fmt: str) -> None:
    """One truthful line under the table (on stderr with ``-o tsv``, which is pure data):
    the cleans done of those eligible, the log's size before and after, and the rate of
    the bytes actually read over the wall time."""
    secs = outcome.elapsed_seconds
    read = _bytes_read(outcome)
    rate = f"{read / 1048576 / secs:,.1f} MiB/s" if secs > 0 else "-"
    click.echo(
        f"{len(outcome.results)} clean(s) of {eligible} eligible partition(s) in {secs:.2f} s of wall time: "
        f"log {binary_bytes(outcome.bytes_before)} -> {binary_bytes(outcome.bytes_after)}; "
        f"read {binary_bytes(read)} ({rate})",
        err=fmt == "tsv",
    )


def _dry_run(
    paths: Sequence[Path],
    policy: Policy,
    time: Time,
    only: Callable[[TopicPartition], bool] | None,
    eligible: list[PartitionReport],
    fmt: str,
) -> None:
    """What the next clean of each eligible partition would remove, from one read of its
    cleanable section (``engine.next_clean``), read-only: nothing is locked or written."""
    wanted = {r.topic_partition for r in eligible}
    with exit_codes_for_errors():
        statuses = [
            s
            for s in cleaning.status(paths, policy, time, next_clean=NextCleanCache(), only=only)
            if s.report.topic_partition in wanted
        ]
    if fmt == "json":
        click.echo(json.dumps([s.as_dict() for s in statuses], indent=2))
        return
    if not statuses:
        click.echo("kafka-cleaner: no partition is eligible; a clean would do nothing", err=True)
        return
    columns = [
        Column("partition"),
        Column("dirty section"),
        Column("dirty records", right=True),
        Column("distinct keys ~", right=True),
        Column("records removed ~", right=True),
        Column("bytes freed ~", right=True),
        Column("tombstones", right=True),
        Column("passes", right=True),
    ]
    rows = []
    for s in statuses:
        r, e = s.report, s.next_clean
        rows.append(
            [
                str(r.topic_partition),
                f"[{r.first_dirty_offset}, {r.first_uncleanable_offset})",
                e.dirty_records if e else None,
                e.dirty_distinct_keys if e else None,
                max(e.dirty_records - e.dirty_distinct_keys, 0) if e else None,
                Bytes(e.bytes_freed) if e else None,
                s.facts.tombstones if s.facts else None,
                e.passes if e else None,
            ]
        )
    print_table(fmt, "kafka-cleaner clean --dry-run (nothing written)", columns, rows)
    click.echo(
        "~ estimated from one read of the key digests (distinct keys: HyperLogLog); records removed counts "
        "the dirty section's superseded records; tombstones: all in the log",
        err=True,
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
@now_option
@threads_option
@filter_options
@force_mode_option
@click.option("--log-level", type=click.Choice(log_format.LEVELS), default="info", show_default=True)
@click.option(
    "--log-format", "log_format_name", type=click.Choice(log_format.FORMATS), default="text", show_default=True
)
def run_command(
    data_dir: tuple[Path, ...],
    policy_path: Path,
    now_ms: int | None,
    threads: int | None,
    topic: str | None,
    partitions: tuple[int, ...],
    force_mode: bool,
    log_level: str,
    log_format_name: str,
) -> None:
    """Run the cleaner threads (with backoff) until SIGTERM/SIGINT, then shut down
    gracefully: in-flight cleans abort and leave no temporary files. Logs a start-up line,
    Kafka's stats line per clean and a shutdown line."""
    log_format.configure(log_level, log_format_name)
    logger = logging.getLogger("cleaner.run")
    policy = load_policy_or_exit(policy_path)
    require_compact_mode(policy, policy_path, force_mode, "run")
    only = partition_filter(topic, partitions)
    warn_unmatched_filters(data_dir, policy, topic)
    time = clock_for(now_ms)
    log_dirs = [LogDirectory(p) for p in data_dir]
    stop = threading.Event()
    caught = _on_signals(stop)
    config = cleaning.with_threads(policy, threads)
    with exit_codes_for_errors(), cleaning.locked(log_dirs):
        manager = LogCleanerManager(log_dirs, policy, time, only=only)
        cleans: list[CleanResult] = []
        pool = LogCleaner(manager, config, time, on_cleaned=cleans.append)
        logs = manager.logs()
        logger.info(
            "kafka-cleaner run started: %d partition(s) of %d topic(s) in %s; %d cleaner thread(s); policy %s",
            len(logs),
            len({tp.topic for tp in logs}),
            ", ".join(str(d) for d in log_dirs),
            config.threads,
            policy_path,
        )
        started = SYSTEM_TIME.nanoseconds()
        pool.start()
        try:
            while not stop.wait(1.0):
                restarted = pool.restart_dead_threads()
                if restarted:
                    logger.warning("restarted %d dead cleaner thread(s)", restarted)
        finally:
            pool.shutdown()
        logger.info(
            "kafka-cleaner run stopped by %s after %.1f s: %d clean(s), %d uncleanable partition(s); "
            "cleans in progress were aborted and left nothing behind",
            signal.Signals(caught[0]).name if caught else "request",
            (SYSTEM_TIME.nanoseconds() - started) / 1e9,
            len(cleans),
            sum(len(t) for t in manager.uncleanable_partitions().values()),
        )


FAIL_ON = ("uncleanable", "eligible")


@click.command("status")
@log_dir_argument
@policy_option
@now_option
@filter_options
@output_option
@click.option(
    "--fail-on",
    default="",
    metavar="STATES",
    help="Exit 1 when some partition is in one of these comma-separated states: uncleanable, eligible.",
)
def status_command(
    data_dir: tuple[Path, ...],
    policy_path: Path,
    now_ms: int | None,
    topic: str | None,
    partitions: tuple[int, ...],
    output: str | None,
    as_json: bool,
    fail_on: str,
) -> None:
    """Per partition: first dirty offset, clean/cleanable/held-back bytes, cleanable
    ratio, eligible now or why not, compaction delay, tombstones and the oldest one's
    age; below the table, why a partition is held back (the damage a clean would meet, with
    its file and byte) and the open transaction holding one back, also when it is eligible
    below it. Read-only: safe next to a live broker."""
    states = {s.strip() for s in fail_on.split(",") if s.strip()}
    if states - set(FAIL_ON):
        raise click.BadParameter(
            f"unknown state(s) {sorted(states - set(FAIL_ON))}; choose from {', '.join(FAIL_ON)}",
            param_hint="--fail-on",
        )
    policy = load_policy_or_exit(policy_path)
    fmt = resolve_format(output, as_json)
    only = partition_filter(topic, partitions)
    time = clock_for(now_ms)
    warn_unmatched_filters(data_dir, policy, topic)
    with exit_codes_for_errors():
        manager = _StageManager(data_dir, policy, time, only) if policy.mode is Mode.STAGE else None
        statuses = cleaning.status(
            data_dir, policy, time, next_clean=NextCleanCache(), only=only, manager=manager,
            deletion=DeletionCache.for_policy(policy),
        )
    if not statuses:  # on stderr, whatever the format
        click.echo(f"kafka-cleaner: {no_partitions_message(data_dir, policy, only is not None)}", err=True)
    if fmt == "json":
        click.echo(json.dumps([s.as_dict() for s in statuses], indent=2))
    elif statuses:
        _print_status(statuses, fmt)
    if policy.mode is Mode.STAGE and fmt != "json":  # what stage mode does with each partition
        for line in refusal_lines([Path(d).absolute() for d in data_dir], policy):
            click.echo(f"stage: {line}")
    if _fail_on(statuses, states):
        sys.exit(EXIT_FAIL_ON)


class _StageManager(LogCleanerManager):
    """``status`` of a stage-mode policy: stage mode never writes the broker's
    ``cleaner-offset-checkpoint`` (it belongs to the broker's own cleaner); each commit
    records the partition's own ``cleaned-to`` instead, which is where its dirty section
    starts, as the sidecar reads it."""

    def __init__(self, paths: Sequence[Path], policy: Policy, time: Time, only: PartitionFilter | None) -> None:
        log_dirs = [LogDirectory(p, read_only=True) for p in paths]
        super().__init__(log_dirs, policy, time, write_checkpoints=False, only=only)

    def all_cleaner_checkpoints(self) -> dict[TopicPartition, int]:
        out = super().all_cleaner_checkpoints()
        for tp, managed in self.logs().items():
            if tp not in out and (offset := stage.cleaned_to(managed.log.dir)) is not None:
                out[tp] = offset
        return out


def _lso_line(s: cleaning.PartitionStatus) -> str:
    """The open transaction that holds a partition back, with what ``kafka-transactions.sh
    abort`` needs, whether or not the partition is eligible below it."""
    r, holder = s.report, s.report.lso_holder
    if holder is None:
        return f"{r.topic_partition}: {why_not(r)}"
    age = s.lso_holder_view()["ageSeconds"] if holder.start_timestamp_ms is not None else None
    return (
        f"{r.topic_partition}: an open transaction holds it back from offset {r.first_uncleanable_offset}: producer "
        f"{holder.producer_id} (epoch {holder.producer_epoch}), open since offset {holder.first_offset}"
        + (f" for {Duration(age)}" if age is not None else "")
    )


def _fail_on(statuses: list[cleaning.PartitionStatus], states: set[str]) -> bool:
    failed = False
    for state in sorted(states):
        hit = [
            s.report.topic_partition
            for s in statuses
            if (s.report.eligible if state == "eligible" else s.report.reason == state)
        ]
        if hit:
            failed = True
            names = ", ".join(str(tp) for tp in hit)
            click.echo(f"kafka-cleaner: --fail-on {state}: {len(hit)} partition(s): {names}", err=True)
    return failed


_STATUS_COLUMNS = [  # drop: on a narrow terminal, the highest goes first
    Column("partition"),
    Column("segments", right=True, drop=9),
    Column("size", right=True, drop=4),
    Column("first dirty", right=True, drop=7),
    Column("clean", right=True, drop=8),
    Column("cleanable", right=True),
    Column("held back", right=True, drop=5),
    Column("ratio", right=True),
    Column("eligible"),
    Column("compaction delay", right=True, drop=6),
    Column("tombstones", right=True, drop=2),
    Column("oldest tombstone age", right=True, drop=3),
]


def _print_status(statuses: list[cleaning.PartitionStatus], fmt: str) -> None:
    rows = []
    for s in statuses:
        r = s.report
        age = s.oldest_tombstone_age_ms
        rows.append(
            [
                str(r.topic_partition),
                r.segments,
                Bytes(r.size_bytes),
                r.first_dirty_offset,
                Bytes(r.clean_bytes),
                Bytes(r.cleanable_bytes),
                Bytes(r.uncleanable_bytes),
                f"{r.cleanable_ratio:.2f}",
                "yes" if r.eligible else f"no ({r.reason})",
                Duration(r.compaction_delay_ms // 1000),
                s.facts.tombstones if s.facts else None,
                Duration(age // 1000) if age is not None else None,
            ]
        )
    print_table(fmt, "kafka-cleaner status", _STATUS_COLUMNS, rows)
    if fmt == "tsv":
        return
    lines = [
        f"{s.report.topic_partition}: {why_not(s.report)}"
        for s in statuses
        if not s.report.eligible and s.report.reason not in (None, "activeSegment", "notCompacted", "lso")
    ]
    lines += [_lso_line(s) for s in statuses if s.report.lso_holder is not None or s.report.reason == "lso"]
    lines += [
        f"{s.report.topic_partition}: {line}"
        for s in statuses
        if s.deletion and s.deletion.deadline_ms is not None and (line := s.deletion.describe())
    ]  # the ages of partitions without a deadline are in --json
    for line in lines:
        click.echo(line)
    click.echo(
        "held back: bytes at or past the first uncleanable offset (the active segment, open transactions, "
        "min.compaction.lag.ms), which no clean may touch yet"
    )
