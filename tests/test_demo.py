"""``make demo`` keeps working: the demo generates, cleans and reports, at a small size."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cleaner.demo import MARKER


def test_demo_end_to_end(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo-data"
    script = Path(sys.executable).with_name("kafka-cleaner")
    proc = subprocess.run(
        [str(script), "demo", "--dir", str(data_dir), "--size-mb", "8"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (data_dir / MARKER).exists()
    assert "before and after" in proc.stdout and "smaller" in proc.stdout
    # One total: the records generated are the records the table counts before the clean
    # (transaction markers are in neither), and sizes are in binary units.
    generated = re.search(r"MiB, ([\d,]+) records \(", proc.stdout)
    total = re.search(r"total\s*│\s*[\d.]+ [KM]iB\s*│\s*[\d.]+ [KM]iB\s*│\s*([\d,]+)", proc.stdout)
    assert generated and total and generated.group(1) == total.group(1), proc.stdout
    policy = data_dir.with_name("demo-data.policy.yaml")
    # Running it again recreates its own directory...
    again = subprocess.run(
        [str(script), "demo", "--dir", str(data_dir), "--size-mb", "4"], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr
    # ...and the cleaned directory verifies and reports nothing eligible any more.
    verify = subprocess.run([str(script), "dump", "--verify", str(data_dir)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr[-2000:]
    status = subprocess.run(
        [str(script), "status", str(data_dir), "--policy", str(policy), "--json", "--now-ms", "1700003600000"],
        capture_output=True,
        text=True,
    )
    assert status.returncode == 0 and '"eligible": true' not in status.stdout


def test_demo_refuses_a_directory_it_did_not_create(tmp_path: Path) -> None:
    precious = tmp_path / "broker-data"
    precious.mkdir()
    (precious / "meta.properties").write_text("version=1\n")
    script = Path(sys.executable).with_name("kafka-cleaner")
    proc = subprocess.run([str(script), "demo", "--dir", str(precious)], capture_output=True, text=True)
    assert proc.returncode != 0 and "was not created by the demo" in proc.stderr
    assert (precious / "meta.properties").read_text() == "version=1\n"
