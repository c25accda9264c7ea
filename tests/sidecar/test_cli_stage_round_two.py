"""Stage mode as ``kafka-cleaner status`` and ``stage commit`` show it (issue 27, item 5):
each staged set listed once whatever the path's spelling, a committed range no longer
dirty, ``stage commit`` next to a live broker exits 4 as documented even with nothing
staged, and the engine's log says that stage mode stages (it swaps nothing in)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from broker_lock import BrokerLock
from click.testing import CliRunner
from sidecar_helpers import NO_DISK_FLOOR, NOW_MS, SMALL_CLEANER, new_sidecar, next_scan, write_policy

from cleaner.cli import main
from cleaner.sidecar import stage

TOPICS = [{"match": "topic-.*", "cleanupPolicy": "compact"}]


def _staged(tmp_path: Path, make_log_dir) -> tuple[Path, Path]:
    """A log dir whose two partitions each hold a staged set, made by a stage-mode sidecar
    next to a (simulated) running broker; the broker is stopped again on return."""
    data = make_log_dir(topics=1, partitions=2, records=4_000, keys=300)
    policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=TOPICS, stage=NO_DISK_FLOOR,
                          cleaner=SMALL_CLEANER)  # fmt: skip
    with BrokerLock(data):
        sc = new_sidecar(policy, [data])
        for _ in range(5):
            next_scan(sc)
    assert sorted(p.name for p in data.iterdir() if p.is_dir() and stage.load(p) is not None) == [
        "topic-0-0", "topic-0-1"
    ]  # fmt: skip
    return data, policy


def _status(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["status", *map(str, args), "--now-ms", str(NOW_MS)])
    return result.exit_code, result.output


def test_status_on_a_relative_path_lists_each_staged_set_once(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, policy = _staged(tmp_path, make_log_dir)
    monkeypatch.chdir(data.parent)
    code, out = _status(data.name, "--policy", policy.name)
    assert code == 0, out
    stage_lines = sorted(line for line in out.splitlines() if line.startswith("stage: "))
    assert stage_lines == ["stage: topic-0-0: staged", "stage: topic-0-1: staged"], out


def test_after_a_commit_status_shows_the_committed_range_clean(tmp_path: Path, make_log_dir) -> None:
    data, policy = _staged(tmp_path, make_log_dir)
    committed = CliRunner().invoke(main, ["stage", "commit", str(data), "--policy", str(policy)])
    assert committed.exit_code == 0 and "committed 2 set(s)" in committed.output, committed.output
    code, out = _status(data, "--policy", policy, "--json")
    assert code == 0, out
    for row in json.loads(out):
        cleaned_to = stage.cleaned_to(data / f"{row['topic']}-{row['partition']}")
        assert cleaned_to is not None and cleaned_to > 0
        assert row["firstDirtyOffset"] == cleaned_to, row
        assert row["cleanBytes"] > 0 and row["eligible"] is False, row
    # The broker's own cleaner-offset-checkpoint is still never written.
    assert not (data / "cleaner-offset-checkpoint").exists()


def test_stage_commit_next_to_a_live_broker_exits_4_even_with_nothing_staged(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(topics=1, partitions=1, records=500)
    policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=TOPICS)
    with BrokerLock(data):
        result = CliRunner().invoke(main, ["stage", "commit", str(data), "--policy", str(policy)])
    assert result.exit_code == 4, result.output
    assert f"a broker holds {data}/.lock: nothing committed there" in result.output
    stopped = CliRunner().invoke(main, ["stage", "commit", str(data), str(data), "--policy", str(policy)])
    assert stopped.exit_code == 0 and stopped.output.count("committed 0 set(s)") == 1, stopped.output


def test_staging_logs_that_it_stages_and_swaps_nothing_in(
    tmp_path: Path, make_log_dir, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="cleaner.engine.cleaner"):
        _staged(tmp_path, make_log_dir)
    messages = [r.getMessage() for r in caplog.records if r.name == "cleaner.engine.cleaner"]
    assert any(m.startswith("Cleaner 0: Staging cleaned segment") and "not swapped in yet" in m for m in messages)
    assert not [m for m in messages if "Swapping in" in m]
