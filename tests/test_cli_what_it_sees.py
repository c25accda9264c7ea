"""The CLI on a real broker's disk, round two (issue 27): a clock in the wrong unit, a
partition in two log dirs, a log dir given twice, a status table on an 80 or 120 column
terminal, TSV that is pure data, filters that say they are regular expressions, and a
summary-only ``dump --verify``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from kafka_logs import snapshot_dir

from cleaner.cli import main
from cleaner.generate import GeneratorConfig, generate
from cleaner.storage.checkpoint import OffsetCheckpointFile

CLI = Path(sys.executable).with_name("kafka-cleaner")
POLICY = "mode: compact\ntopics:\n  - match: '.*'\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"
PREFIX = "payments.ledger-entries.v2"
DAY_MS = 86_400_000


@pytest.fixture
def logs(tmp_path: Path) -> tuple[Path, Path, int]:
    """Two topics of two partitions (names of 30 characters), small segments."""
    root = tmp_path / "logs"
    config = GeneratorConfig(
        topics=2, partitions=2, records=6_000, value_bytes=60, segment_bytes=64 << 10, topic_prefix=PREFIX
    )
    generate(root, config)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return root, policy, config.clock_ms


def cli(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *map(str, args)], capture_output=True, text=True, check=False, env={**os.environ, **(env or {})}
    )


# -- 3. --now-ms in the wrong unit ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (1_700_000_000, "seconds? then give 1700000000000"),
        (1_700_000_000_000_000, "micro- or nanoseconds?"),
        (-5, "before 1970"),
    ],
    ids=["seconds", "microseconds", "negative"],
)
def test_a_now_ms_that_cannot_be_milliseconds_of_this_era_is_refused_and_nothing_is_written(
    logs: tuple[Path, Path, int], value: int, says: str
) -> None:
    root, policy, _ = logs
    before = snapshot_dir(root)
    for command in ("clean", "status", "run"):
        result = CliRunner().invoke(main, [command, str(root), "--policy", str(policy), "--now-ms", str(value)])
        assert result.exit_code == 2, (command, result.output)
        assert f"{value} is not epoch milliseconds of this era" in result.output and says in result.output
        assert "1000000000000 (2001-09-09)" in result.output
    assert snapshot_dir(root) == before  # in seconds, the next clean would have dropped the tombstones


def test_now_ms_in_milliseconds_is_taken(logs: tuple[Path, Path, int]) -> None:
    root, policy, now = logs
    result = CliRunner().invoke(main, ["status", str(root), "--policy", str(policy), "--now-ms", str(now), "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)) == 4


# -- 4. the same partition in two log dirs; the same log dir twice ------------------------------


def test_a_partition_in_two_log_dirs_is_refused_and_neither_copy_is_touched(
    logs: tuple[Path, Path, int], tmp_path: Path
) -> None:
    root, policy, now = logs
    other = tmp_path / "logs-2"
    shutil.copytree(root, other)
    before = {d: snapshot_dir(d) for d in (root, other)}
    for command in ("clean", "status"):
        result = CliRunner().invoke(main, [command, str(root), str(other), "--policy", str(policy), "--now-ms", now])
        assert result.exit_code == 2, result.output
        assert "4 partition(s) are in more than one log dir; Kafka refuses to start on this" in result.output
        assert f"{PREFIX}-0-0: {root}, {other}" in result.output
    assert {d: snapshot_dir(d) for d in (root, other)} == before


def test_the_same_log_dir_given_twice_counts_once(logs: tuple[Path, Path, int], tmp_path: Path) -> None:
    """Given twice, or under a second name (a symlink), it is one log dir: nothing is
    cleaned twice, and no traceback."""
    root, policy, now = logs
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    status = cli("status", root, alias, root, "--policy", policy, "--now-ms", now, "--json")
    assert status.returncode == 0, status.stderr
    assert sorted(f"{r['topic']}-{r['partition']}" for r in json.loads(status.stdout)) == [
        f"{PREFIX}-{t}-{p}" for t in (0, 1) for p in (0, 1)
    ]
    clean = cli("clean", root, root, alias, "--policy", policy, "--now-ms", now, "--json")
    assert clean.returncode == 0, clean.stderr
    assert "Traceback" not in clean.stderr
    assert len(json.loads(clean.stdout)["cleans"]) == 4
    assert len(OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read()) == 4


# -- 8. the status table on an 80 and a 120 column terminal ------------------------------------


@pytest.mark.parametrize("columns", [80, 120])
def test_the_status_table_fits_the_terminal_and_cuts_no_partition_name(
    logs: tuple[Path, Path, int], columns: int
) -> None:
    root, policy, now = logs
    result = cli("status", root, "--policy", policy, "--now-ms", now, "-o", "table", env={"COLUMNS": str(columns)})
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("\nheld back:")[0]
    lines = table.splitlines()
    assert "…" not in table
    assert all(len(line) <= columns for line in lines), max(lines, key=len)
    for t in (0, 1):
        for p in (0, 1):
            (row,) = [line for line in lines if line.startswith(f"{PREFIX}-{t}-{p} ")]
            assert re.search(r"\d KiB", row) and " yes" in row  # the cleanable bytes and eligible are kept
    assert "(left out to fit" in table and "-o wide shows every column" in table


def test_into_a_pipe_the_wide_table_still_has_every_column(logs: tuple[Path, Path, int]) -> None:
    root, policy, now = logs
    header = cli("status", root, "--policy", policy, "--now-ms", now, env={"COLUMNS": "80"}).stdout.splitlines()[0]
    assert header.split("  ")[0] == "partition" and "oldest tombstone age" in header and "segments" in header


# -- 9. TSV, regular expressions, dump --verify --summary --------------------------------------


def test_tsv_is_pure_data_with_integer_ages(logs: tuple[Path, Path, int]) -> None:
    """Every line of ``clean -o tsv`` has the header's columns (the summary goes to stderr),
    and ``status -o tsv`` prints ages of more than a million seconds as integers."""
    root, policy, now = logs
    later = now + 30 * DAY_MS  # tombstones a month old: 2.6 million seconds
    status = cli("status", root, "--policy", policy, "--now-ms", later, "-o", "tsv")
    rows = [dict(zip(status.stdout.splitlines()[0].split("\t"), line.split("\t"), strict=True))
            for line in status.stdout.splitlines()[1:]]  # fmt: skip
    assert len(rows) == 4
    for row in rows:
        assert re.fullmatch(r"[0-9]{7}", row["oldest_tombstone_age"]), row
        assert re.fullmatch(r"[0-9]+", row["compaction_delay"]), row
    clean = cli("clean", root, "--policy", policy, "--now-ms", later, "-o", "tsv")
    assert clean.returncode == 0, clean.stderr
    lines = clean.stdout.splitlines()
    width = len(lines[0].split("\t"))
    assert len(lines) == 5 and all(len(line.split("\t")) == width for line in lines), lines
    assert "4 clean(s) of 4 eligible partition(s)" in clean.stderr


def test_a_topic_filter_that_matches_nothing_says_it_is_a_regular_expression(logs: tuple[Path, Path, int]) -> None:
    root, policy, now = logs
    for fmt in ("json", "wide"):
        glob = cli("status", root, "--policy", policy, "--now-ms", now, "-o", fmt, "--topic", "payments*")
        assert glob.returncode == 0
        assert (
            "kafka-cleaner: warning: --topic 'payments*' matches no topic here (2 seen): it is a regular expression, "
            "matched against the whole topic name; 'payments.*' would match (as the glob 'payments*' does)"
        ) in glob.stderr, glob.stderr
    clean = cli("clean", root, "--policy", policy, "--now-ms", now, "--topic", "orders")
    assert "--topic 'orders' matches no topic here (2 seen)" in clean.stderr
    assert "would match" not in clean.stderr
    assert "regular expression" in cli("status", "--help").stdout
    assert "regular expression" in cli("clean", "--help").stdout


def test_a_policy_match_written_as_a_glob_is_named(logs: tuple[Path, Path, int], tmp_path: Path) -> None:
    root, _, now = logs
    policy = tmp_path / "glob.yaml"
    policy.write_text("topics:\n  - match: 'payments.ledger-*'\n    cleanupPolicy: compact\n  - match: 'other'\n")
    result = cli("status", root, "--policy", policy, "--now-ms", now, "--json")
    assert json.loads(result.stdout) == []
    assert (
        "the policy's topics[0].match 'payments.ledger-*' matches no topic here: it is a regular expression, matched "
        r"against the whole topic name; 'payments\.ledger-.*' would match" in result.stderr
    ), result.stderr
    assert "topics[1]" not in result.stderr  # a rule for topics of other brokers is no mistake


def test_dump_verify_summary_prints_one_line_per_damaged_file_and_the_count(logs: tuple[Path, Path, int]) -> None:
    root, _, _ = logs
    partition = root / f"{PREFIX}-0-0"
    log = sorted(partition.glob("*.log"))[0]
    with open(log, "r+b") as f:
        f.truncate(log.stat().st_size - 100)
    result = cli("dump", "--verify", "--summary", root)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert [line.split(": ")[0] for line in lines[:-1]] == [
        str(log),
        str(log.with_suffix(".index")),
        str(log.with_suffix(".timeindex")),
    ], lines
    assert re.fullmatch(r"3 problem\(s\) found in 3 of [0-9]+ file\(s\)", lines[-1]), lines
    healthy = cli("dump", "--verify", "--summary", root / f"{PREFIX}-1-1")
    assert healthy.returncode == 0 and healthy.stdout == ""
    assert re.fullmatch(r"verified [0-9]+ file\(s\): no problems found\n", healthy.stderr)
    alone = cli("dump", "--summary", root)
    assert alone.returncode == 2 and "--summary goes with --verify" in alone.stderr
