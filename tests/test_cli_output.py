"""What the CLI prints (issue 15): full values into a pipe, ``--output table|wide|tsv|json``,
binary units, the ``--topic``/``--partition`` filters, ``clean --dry-run``, ``status
--fail-on``, empty results that say why, and ``run``'s log lines."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka_logs import snapshot_dir

from cleaner.generate import GeneratorConfig, generate
from cleaner.output import ByteProgress, Duration, binary_bytes
from cleaner.storage.checkpoint import OffsetCheckpointFile

CLI = Path(sys.executable).with_name("kafka-cleaner")
POLICY = "mode: compact\ntopics:\n  - match: '.*'\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"
PREFIX = "payments.ledger-entries.v2.compacted-by-account-and-currency"
A, B = f"{PREFIX}-0", f"{PREFIX}-1"  # topic names longer than any terminal column


@pytest.fixture
def logs(tmp_path: Path) -> tuple[Path, Path, str]:
    """Two topics of two partitions, with long names."""
    root = tmp_path / "logs"
    config = GeneratorConfig(
        topics=2, partitions=2, records=12_000, value_bytes=60, segment_bytes=128 << 10, topic_prefix=PREFIX
    )
    generate(root, config)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return root, policy, str(config.clock_ms)


def cli(*args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, check=False)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_binary_units_and_durations_for_people_and_a_progress_bar_never_passes_its_total() -> None:
    assert [binary_bytes(n) for n in (0, 1023, 1024, 1536, 5 << 20, 3 << 30)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 MiB", "3.0 GiB",
    ]  # fmt: skip
    assert [str(Duration(s)) for s in (12, 250, 7_500, 277_200)] == ["12s", "4m 10s", "2h 5m", "3d 5h"]
    bar = ByteProgress("work", 100, enabled=False)
    for _ in range(7):
        bar.advance(30)
    assert bar.completed == 210 and bar.total == 210  # the total grew with the work


def test_status_into_a_pipe_is_complete_and_tsv_carries_raw_numbers(logs: tuple[Path, Path, str]) -> None:
    root, policy, now = logs
    piped = cli("status", root, "--policy", policy, "--now-ms", now).stdout
    assert all(f"{t}-{p}" in piped for t in (A, B) for p in (0, 1)) and "…" not in piped
    assert "MiB" in piped or "KiB" in piped
    assert " MB" not in piped
    document = json.loads(cli("status", root, "--policy", policy, "--now-ms", now, "-o", "json").stdout)
    rows = {f"{r['topic']}-{r['partition']}": r for r in document}
    tsv = cli("status", root, "--policy", policy, "--now-ms", now, "-o", "tsv").stdout.splitlines()
    header = tsv[0].split("\t")
    assert len(tsv) == 1 + len(rows)
    for line in tsv[1:]:
        cells = dict(zip(header, line.split("\t"), strict=True))
        row = rows[cells["partition"]]
        assert int(cells["size"]) == row["sizeBytes"] and int(cells["cleanable"]) == row["cleanableBytes"]


def test_filters_select_partitions_and_leave_the_others_and_their_checkpoints_alone(
    logs: tuple[Path, Path, str],
) -> None:
    root, policy, now = logs
    status = json.loads(
        cli("status", root, "--policy", policy, "--now-ms", now, "--json", "--topic", "pay.*", "--partition", 1).stdout
    )
    assert [(r["topic"], r["partition"]) for r in status] == [(A, 1), (B, 1)]
    untouched = snapshot_dir(root / f"{A}-0")
    cli("clean", root, "--policy", policy, "--now-ms", now, "--topic", A.replace(".", r"\."), "--partition", "1")
    checkpoint = OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read()
    assert {f"{tp.topic}-{tp.partition}" for tp in checkpoint} == {f"{A}-1"}
    cli("clean", root, "--policy", policy, "--now-ms", now, "--topic", ".*-1")
    checkpoint = OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read()
    assert {f"{tp.topic}-{tp.partition}" for tp in checkpoint} == {f"{A}-1", f"{B}-0", f"{B}-1"}  # A-1's kept
    assert snapshot_dir(root / f"{A}-0") == untouched
    nothing = cli("status", root, "--policy", policy, "--topic", "orders-.*")
    assert "--topic/--partition select none of those the rules (.*) match (2 topic(s) seen" in nothing.stderr


def test_dry_run_writes_nothing_and_estimates_what_the_clean_removes(logs: tuple[Path, Path, str]) -> None:
    root, policy, now = logs
    before = snapshot_dir(root)
    dry = cli("clean", root, "--policy", policy, "--now-ms", now, "--dry-run", "--json")
    assert snapshot_dir(root) == before  # no lock, no checkpoint, no segment, mtimes included
    estimates = {f"{r['topic']}-{r['partition']}": r["nextClean"] for r in json.loads(dry.stdout)}
    assert len(estimates) == 4
    cleaned = json.loads(cli("clean", root, "--policy", policy, "--now-ms", now, "--json").stdout)
    for c in cleaned["cleans"]:
        e = estimates[f"{c['topic']}-{c['partition']}"]
        removed = c["recordsRead"] - c["recordsWritten"]
        assert abs((e["dirtyRecords"] - e["dirtyDistinctKeys"]) - removed) <= 0.05 * removed, (e, c)
    table = cli("clean", root, "--policy", policy, "--now-ms", now, "--dry-run")
    assert "no partition is eligible" in table.stderr


def test_status_fail_on_exits_1_naming_the_partitions(logs: tuple[Path, Path, str]) -> None:
    root, policy, now = logs
    eligible = cli("status", root, "--policy", policy, "--now-ms", now, "--fail-on", "eligible", check=False)
    assert eligible.returncode == 1 and "--fail-on eligible: 4 partition(s): " in eligible.stderr
    assert cli("status", root, "--policy", policy, "--now-ms", now, "--fail-on", "uncleanable").returncode == 0
    bad = cli("status", root, "--policy", policy, "--fail-on", "dirty", check=False)
    assert bad.returncode == 2 and "unknown state(s) ['dirty']" in bad.stderr


def test_run_logs_a_start_line_and_a_shutdown_line_as_json(logs: tuple[Path, Path, str]) -> None:
    root, policy, _ = logs
    proc = subprocess.Popen(
        [str(CLI), "run", str(root), "--policy", str(policy), "--log-format", "json", "--threads", "1"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    first = json.loads(proc.stderr.readline())
    assert first["level"] == "INFO" and first["message"].startswith("kafka-cleaner run started: 4 partition(s) of 2")
    deadline = time.monotonic() + 60
    while not OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read() and time.monotonic() < deadline:
        time.sleep(0.05)  # polls for the first clean; never a fixed wait
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(30) == 0
    lines = [json.loads(line) for line in rest.splitlines() if line.strip()]
    assert lines[-1]["message"].startswith("kafka-cleaner run stopped by SIGTERM after ")


def test_dump_filters_keep_the_files_of_the_partitions_asked_for(logs: tuple[Path, Path, str]) -> None:
    root, _, _ = logs
    dumped = cli("dump", root, "--topic", A.replace(".", r"\."), "--partition", 1).stdout
    starts = [line.removeprefix("Dumping ") for line in dumped.splitlines() if line.startswith("Dumping")]
    dirs = {Path(p).parent.name for p in starts}
    assert dirs == {f"{A}-1"}
    none = cli("dump", root, "--topic", "orders", check=False)
    assert none.returncode == 2 and "no partition dir in" in none.stderr


def test_shell_completion_and_both_commands_versions_as_the_readme_says() -> None:
    import os

    script = subprocess.run(
        [str(CLI)],
        env=os.environ | {"_KAFKA_CLEANER_COMPLETE": "bash_source"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert "_kafka_cleaner_completion()" in script.stdout
    words = subprocess.run(
        [str(CLI)],
        env={**os.environ, "_KAFKA_CLEANER_COMPLETE": "bash_complete", "COMP_WORDS": "kafka-cleaner st"}
        | {"COMP_CWORD": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert words.stdout.split() == ["plain,stage", "plain,status"]
    from cleaner import __version__

    for command in ("kafka-cleaner", "kafka-cleaner-operator"):
        out = subprocess.run([str(CLI.with_name(command)), "--version"], capture_output=True, text=True, check=True)
        assert __version__ in out.stdout


def test_dump_prints_keys_and_values_with_each_decoder_and_an_offset_range(logs: tuple[Path, Path, str]) -> None:
    import base64

    root, _, _ = logs
    log = sorted((root / f"{A}-0").glob("*.log"))[0]

    def records(*args: str) -> list[dict]:
        document = json.loads(cli("dump", log, "--print-data-log", "--json", *args).stdout)
        return [r for b in document[0]["batches"] for r in b["records"]]

    text = records("--decoder", "utf8", "--offsets", "10:20")
    assert [r["offset"] for r in text] == list(range(10, 21))
    raw = records("--decoder", "base64", "--offsets", "10:20")
    hexed = records("--decoder", "hex", "--offsets", "10:20")
    for t, b, h in zip(text, raw, hexed, strict=True):
        assert base64.b64decode(b["key"]) == bytes.fromhex(h["key"]) == t["key"].encode()
        assert t["value"] is None or base64.b64decode(b["value"]).decode() == t["value"]
    lines = cli("dump", log, "--print-data-log", "--offsets", "10:11").stdout.splitlines()
    shown = [line for line in lines if line.startswith("| offset: ")]
    assert len(shown) == 2 and all(f" key: {t['key']}" in s for s, t in zip(shown, text, strict=False))
    bad = cli("dump", log, "--offsets", "9", check=False)
    assert bad.returncode == 2 and "is not FROM:TO" in bad.stderr
