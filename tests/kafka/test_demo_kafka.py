"""``make demo-kafka`` keeps working: a real broker, a workload, status, clean, the broker again."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kafka_broker import KAFKA_LINES, REPO, available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not available(KAFKA_LINES[0]), reason=f"run make setup (Kafka {KAFKA_LINES[0]})"),
]


def test_demo_kafka_cleans_a_real_brokers_log_dir_and_the_broker_serves_it() -> None:
    done = subprocess.run(
        [sys.executable, "-P", str(REPO / "scripts" / "demo_kafka.py"), "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "kafka-cleaner status" in out and "kafka-cleaner clean" in out
    verdicts = [line.split(maxsplit=1) for line in out.splitlines()[-3:]]
    assert [v[0] for v in verdicts] == ["yes", "yes", "yes"], out[-2000:]
    assert "compacted-2" in out and "before and after" in out
