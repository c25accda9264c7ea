"""``kafka-cleaner stage``: stage mode's sets by hand.

- ``status``: per compacted partition, its staged set (valid now, or why stale) or why
  stage mode refuses it. Read-only.
- ``commit``: the sidecar's fenced commit (``stage.commit_log_dir``), for a broker run
  without Kubernetes (e.g. systemd's ``ExecStartPre`` of the broker unit). Exit 4 when a
  broker holds a log dir's ``.lock``. Like the sidecar's, it obeys the policy (``--policy``)
  and the cluster's topic config as they are right before each set (``guards.CommitCheck``):
  a set they no longer want is discarded, not committed.
- ``discard``: delete everything kafka-cleaner keeps in the partition dirs (what deleting a
  stage-mode policy does). Safe next to a running broker: it never reads the stage areas.

Each command accepts only Kafka log dirs (``is_kafka_log_dir``), and exits 2 on anything else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from cleaner.clock import SYSTEM_TIME
from cleaner.commands import EXIT_FAIL_ON, EXIT_LOCKED, EXIT_OK, EXIT_USAGE, load_policy_or_exit
from cleaner.output import binary_bytes
from cleaner.storage.log_dir import LogDirectory, is_kafka_log_dir

from . import stage
from .guards import CommitCheck, stage_report


def _log_dirs_or_exit(paths: tuple[Path, ...]) -> list[Path]:
    bad = [p for p in paths if not is_kafka_log_dir(p)]
    for p in bad:
        click.echo(f"kafka-cleaner: {p} is not a Kafka log dir (no meta.properties, no checkpoints)", err=True)
    if bad:
        sys.exit(EXIT_USAGE)
    unique: dict[Path, Path] = {}  # each directory once, however it is spelled
    for p in paths:
        unique.setdefault(p.resolve(), p.absolute())
    return list(unique.values())


@click.group("stage")
def stage_group() -> None:
    """Stage mode's staged sets: status, commit (broker stopped), discard."""


@stage_group.command("status")
@click.argument("log_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--policy", "policy_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
def status_command(log_dirs: tuple[Path, ...], policy_path: Path, as_json: bool) -> None:
    """Per compacted partition: staged (valid now), stale (why), refused (why) or none."""
    policy = load_policy_or_exit(policy_path)
    report = stage_report(_log_dirs_or_exit(log_dirs), policy)
    if as_json:
        click.echo(json.dumps({"partitions": report}, indent=2))
        return
    for e in report:
        extra = ""
        if "baseOffset" in e:
            extra = f"  [{e['baseOffset']}, {e['nextOffset']}) {binary_bytes(e['stagedBytes'])}"
        click.echo(f"{e['partition']}\t{e['state']}{extra}" + (f"\t{e['reason']}" if e.get("reason") else ""))


@stage_group.command("commit")
@click.argument("log_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--policy",
    "policy_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The policy in force (the sidecar's): read again right before each set; a set it no longer "
    "stages is discarded.",
)
@click.option(
    "--max-seconds",
    type=click.IntRange(min=0),
    default=60,
    show_default=True,
    help="Sets not reached by then stay staged.",
)
def commit_command(log_dirs: tuple[Path, ...], policy_path: Path, max_seconds: int) -> None:
    """Commit every valid staged set under the log dir's .lock (the broker must be stopped;
    a stale set is deleted, and so is a set the policy or the cluster's topic config in force
    no longer wants). Exit 4 if a broker holds a log dir, 1 if this uid may not commit in one."""
    policy = load_policy_or_exit(policy_path)
    dirs = _log_dirs_or_exit(log_dirs)
    deadline = SYSTEM_TIME.nanoseconds() + max_seconds * 1_000_000_000
    # Every dir given: the cluster's metadata log is in one of them (``metadata.log.dir``).
    check = CommitCheck(policy_path, dirs, last_good=policy)
    code = EXIT_OK
    for d in dirs:
        # Asked first, whether or not a set is staged there: a broker running is what the
        # person (or the broker unit's ExecStartPre) needs to know.
        locked = LogDirectory(d).is_locked_by_broker()
        report = None if locked else stage.commit_log_dir(d, SYSTEM_TIME, deadline, wanted=check)
        if report is None or not report.locked:
            click.echo(
                f"kafka-cleaner: a broker holds {d}/.lock: nothing committed there (commit needs the broker stopped)",
                err=True,
            )
            code = EXIT_LOCKED
            continue
        for tp, why in report.deleted:
            click.echo(f"{tp}: stale set deleted: {why}")
        for tp, unwanted in report.discarded:
            click.echo(f"{tp}: set discarded: {unwanted.message}")
        for tp, message in report.errors:
            click.echo(f"{tp}: commit failed: {message}", err=True)
        if report.refused is not None:
            code = EXIT_FAIL_ON if code == EXIT_OK else code
            continue
        for tp in report.left:
            click.echo(f"{tp}: --max-seconds ran out; the set stays staged")
        reclaimed = sum(b for _, b in report.committed)
        click.echo(
            f"{d}: committed {len(report.committed)} set(s), {binary_bytes(reclaimed)} reclaimed; "
            f"deleted {len(report.deleted)} stale set(s); discarded {len(report.discarded)} the policy or the "
            "cluster's topic config no longer wants"
        )
    sys.exit(code)


@stage_group.command("discard")
@click.argument("log_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
def discard_command(log_dirs: tuple[Path, ...]) -> None:
    """Delete every staged set and stage area (a deleted stage-mode policy). Safe while the
    broker runs."""
    for d in _log_dirs_or_exit(log_dirs):
        gone = stage.staged_partitions(d)
        for pdir in gone.values():
            stage.delete_area(pdir)
        click.echo(f"{d}: removed the stage areas of {len(gone)} partition(s)")
