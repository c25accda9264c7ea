"""The CLI as a person on call meets it (issue 15): it refuses what is not a Kafka log dir
and leaves it untouched, refuses to compact with a policy that says observe, reports an
interrupted clean as interrupted (exit 130/143), and counts what ``dump`` verifies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from kafka_logs import snapshot_dir

from cleaner.cli import main
from cleaner.generate import GeneratorConfig, generate

CLI = Path(sys.executable).with_name("kafka-cleaner")
COMPACT = "mode: compact\ntopics:\n  - match: '.*'\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"
OBSERVE = "topics:\n  - match: '.*'\n    cleanupPolicy: compact\n"


def _policy(tmp_path: Path, text: str = COMPACT) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def _etc_like(root: Path) -> Path:
    """A tree like /etc: ``name-N`` directories holding files, and nothing of Kafka's."""
    for name, files in {"dbus-1": ["system.conf"], "polkit-1": ["rules"], "nginx": ["nginx.conf"]}.items():
        (root / name).mkdir(parents=True)
        for f in files:
            (root / name / f).write_text("setting = 1\n")
    return root


@pytest.mark.parametrize(
    "args",
    [["clean", "--policy", "{policy}"], ["status", "--policy", "{policy}"], ["run", "--policy", "{policy}"]],
    ids=["clean", "status", "run"],
)
def test_a_tree_that_is_not_a_log_dir_is_refused_and_untouched(tmp_path: Path, args: list[str]) -> None:
    tree = _etc_like(tmp_path / "etc")
    before = snapshot_dir(tree)
    policy = _policy(tmp_path)
    result = CliRunner().invoke(main, [args[0], str(tree), *(a.format(policy=policy) for a in args[1:])])
    assert result.exit_code == 2
    assert "is not a Kafka log dir" in result.output
    assert snapshot_dir(tree) == before  # bytes and mtimes; no .lock, no segment


def test_dump_of_a_tree_without_kafka_files_is_an_error_not_a_pass(tmp_path: Path) -> None:
    tree = _etc_like(tmp_path / "etc")
    before = snapshot_dir(tree)
    result = CliRunner().invoke(main, ["dump", "--verify", str(tree)])
    assert result.exit_code == 2 and "nothing to dump" in result.output
    assert "no problems found" not in result.output
    assert snapshot_dir(tree) == before


def test_a_partition_dir_is_refused_with_the_log_dir_to_use(tmp_path: Path) -> None:
    generate(tmp_path / "logs", GeneratorConfig(topics=1, partitions=1, records=200))
    partition = tmp_path / "logs" / "topic-0-0"
    result = CliRunner().invoke(main, ["status", str(partition), "--policy", str(_policy(tmp_path))])
    assert result.exit_code == 2
    assert f"{partition} is a partition dir; give its log dir: {partition.parent}" in result.output


def test_a_name_n_directory_without_segments_in_a_log_dir_gets_nothing(tmp_path: Path) -> None:
    generate(tmp_path / "logs", GeneratorConfig(topics=1, partitions=1, records=2_000, segment_bytes=16 * 1024))
    stray = tmp_path / "logs" / "backup-1"
    stray.mkdir()
    (stray / "notes.txt").write_text("not a partition\n")
    result = CliRunner().invoke(main, ["clean", str(tmp_path / "logs"), "--policy", str(_policy(tmp_path))])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in stray.iterdir()) == ["notes.txt"]
    listed = CliRunner().invoke(main, ["status", str(tmp_path / "logs"), "--policy", str(_policy(tmp_path)), "--json"])
    assert "backup" not in listed.output


def test_clean_refuses_an_observe_policy_unless_forced(tmp_path: Path) -> None:
    generate(tmp_path / "logs", GeneratorConfig(topics=1, partitions=1, records=2_000, segment_bytes=16 * 1024))
    before = snapshot_dir(tmp_path / "logs")
    observe = _policy(tmp_path, OBSERVE)
    refused = CliRunner().invoke(main, ["clean", str(tmp_path / "logs"), "--policy", str(observe)])
    assert refused.exit_code == 2 and "mode is observe" in refused.output and "--force-mode" in refused.output
    assert snapshot_dir(tmp_path / "logs") == before
    forced = CliRunner().invoke(main, ["clean", str(tmp_path / "logs"), "--policy", str(observe), "--force-mode"])
    assert forced.exit_code == 0, forced.output
    assert snapshot_dir(tmp_path / "logs") != before


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_clean_says_so_and_exits_128_plus_the_signal(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """A throttled clean (1 MB/s, once Kafka's throttle checks the rate after 300 ms) is in
    flight for seconds a partition (4 MB each: 3 MB of rolled segments to map, then to
    clean); the signal, half a second into the first partition's cleaning pass, ends it at
    once, with what was done and what was not."""
    logs = tmp_path / "logs"
    config = GeneratorConfig(topics=1, partitions=4, records=80_000, value_bytes=200, segment_bytes=1 << 20)
    generate(logs, config)
    policy = _policy(tmp_path, COMPACT + "cleaner:\n  maxIoBytesPerSecond: 1000000\n")
    proc = subprocess.Popen(
        [str(CLI), "clean", str(logs), "--policy", str(policy), "--now-ms", str(config.clock_ms)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180  # the map pass reads 3 MB at 1 MB/s first; slower on a loaded machine
    while not any(p.name.endswith(".cleaned") for p in logs.glob("*/*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no clean started"
        time.sleep(0.01)
    time.sleep(0.5)  # past the throttle's first check: the round sleeps
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == code, out + err
    assert f"interrupted by {sig.name}" in err and "still eligible: topic-0-" in err, err
    assert "Traceback" not in err
    assert not [p for p in logs.glob("*/*") if p.name.endswith((".cleaned", ".swap"))]


def test_a_truncated_segment_is_uncleanable_in_status_and_clean_names_it_once(tmp_path: Path) -> None:
    """A ``.log`` cut short (a bad copy, a full disk): ``status`` says uncleanable with the
    file, byte and cause before any clean; ``clean`` prints one line for it, cleans the
    other partitions, exits 3 and leaves the damaged file as it was."""
    logs = tmp_path / "logs"
    config = GeneratorConfig(topics=1, partitions=2, records=20_000, value_bytes=100, segment_bytes=256 << 10)
    generate(logs, config)
    victim_dir = logs / "topic-0-0"
    victim = sorted(victim_dir.glob("*.log"))[1]
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size - 100)
    policy = _policy(tmp_path)
    now = str(config.clock_ms)
    status = subprocess.run(
        [str(CLI), "status", str(logs), "--policy", str(policy), "--now-ms", now, "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    rows = {f"{r['topic']}-{r['partition']}": r for r in json.loads(status.stdout)}
    damaged = rows["topic-0-0"]
    assert damaged["eligible"] is False and damaged["reason"] == "uncleanable"
    assert damaged["uncleanableReason"].startswith(f"{victim}, byte ")
    assert "truncated batch: the file ends" in damaged["uncleanableReason"]
    assert rows["topic-0-1"]["eligible"] is True

    before = snapshot_dir(victim_dir)
    clean = subprocess.run(
        [str(CLI), "clean", str(logs), "--policy", str(policy), "--now-ms", now],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert clean.returncode == 3, clean.stdout + clean.stderr
    lines = [line for line in clean.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in clean.stderr, clean.stderr
    expected = f"kafka-cleaner: partition topic-0-0 in {logs} is uncleanable: {victim}, byte "
    assert lines[0].startswith(expected), repr(lines[0][:300])
    assert "truncated batch: the file ends" in lines[0]
    assert snapshot_dir(victim_dir) == before
    assert "topic-0-1" in clean.stdout


def _verify(target: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "dump", "--verify", *extra, str(target)], capture_output=True, text=True, check=False
    )


def test_verify_names_a_truncation_once_with_its_consequences_and_counts_exactly(tmp_path: Path) -> None:
    """A ``.log`` cut to a third: one truncated batch, and one finding per index for the
    hundreds of entries now past the log's end (not one line each, not a cut-off list)."""
    logs = tmp_path / "logs"
    generate(logs, GeneratorConfig(topics=1, partitions=1, records=200_000, value_bytes=50, segment_bytes=8 << 20))
    partition = logs / "topic-0-0"
    log = sorted(partition.glob("*.log"))[0]
    index_entries = (log.with_suffix(".index")).stat().st_size // 8
    with open(log, "r+b") as f:
        f.truncate(log.stat().st_size // 3)
    result = _verify(partition)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"{log}: byte ") and "truncated batch: the file ends" in lines[0], lines
    assert lines[1].startswith(f"{log.with_suffix('.index')}: byte ") and "beyond the log" in lines[1], lines
    assert lines[2].startswith(f"{log.with_suffix('.timeindex')}: byte ") and "beyond the log" in lines[2], lines
    beyond = int(lines[1].split(" entries): ")[0].rsplit("(", 1)[1])
    assert index_entries // 2 < beyond < index_entries  # two thirds of the entries, in one finding
    assert lines[3:] == ["3 problem(s) found in 3 of 10 file(s)"]
    document = json.loads(_verify(partition, "--json").stdout)
    assert sum(len(f["problems"]) for f in document) == 3


def test_verify_counts_every_problem_and_prints_a_bounded_number_per_file(tmp_path: Path) -> None:
    """An offset index of 30 entries that each point inside a batch: 30 problems counted,
    20 printed and a line for the rest (not counted as one), every one in ``--json``."""
    import numpy as np

    from cleaner.storage.index import OFFSET_INDEX_DTYPE

    logs = tmp_path / "logs"
    generate(logs, GeneratorConfig(topics=1, partitions=1, records=20_000, value_bytes=50, segment_bytes=8 << 20))
    log = sorted((logs / "topic-0-0").glob("*.log"))[0]
    index = log.with_suffix(".index")
    rows = np.zeros(30, dtype=OFFSET_INDEX_DTYPE)
    rows["relative_offset"] = np.arange(1, 31) * 10
    rows["position"] = np.arange(1, 31) * 3  # inside the first batch, never the start of one
    index.write_bytes(rows.tobytes())
    result = _verify(index)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    shown = [line for line in lines if "is not the start of a batch" in line]
    assert len(shown) == 20
    assert f"{index}: 10 more problem(s) not shown (--json lists every one)" in lines
    assert lines[-1] == "30 problem(s) found in 1 of 1 file(s)"
    document = json.loads(_verify(index, "--json").stdout)
    assert len(document[0]["problems"]) == 30
