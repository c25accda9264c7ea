"""The soak (issue 21, item 7): the real sidecar process next to a real, busy broker, on both
Kafka lines. What it runs and checks: ``soak_kafka.py``.

``SOAK_SECONDS`` is the workload's duration per Kafka line (default 60: what ``make test``
runs; ``make soak`` runs 600), half in observe mode and half in stage mode; broker starts and
the final pod restart come on top. ``SOAK_SEED`` (default 21) draws the records and the
events; ``SOAK_REPORT_DIR``, when set, receives ``soak-<line>.json`` with the figures.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest
from kafka_broker import EACH_KAFKA_LINE
from soak_kafka import Soak

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "60"))
SOAK_SEED = int(os.environ.get("SOAK_SEED", "21"))

pytestmark = [
    pytest.mark.slow,
    EACH_KAFKA_LINE,
    # The workload, then at most a few minutes of broker starts on a loaded machine.
    pytest.mark.timeout(int(SOAK_SECONDS * 1.5) + 900),
]


def test_soak_next_to_a_busy_broker(tmp_path: Path, line: str, record_property) -> None:
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # restarts make kafka-python chatty
    soak = Soak(tmp_path, line, SOAK_SECONDS, SOAK_SEED)
    figures = soak.run(observe_s=SOAK_SECONDS / 2, stage_s=SOAK_SECONDS / 2)
    report = figures.table()
    print(f"\n--- soak, Kafka {line}, {tmp_path} ---\n{report}")
    record_property("soak", json.dumps(dataclasses.asdict(figures)))
    (tmp_path / "figures.json").write_text(json.dumps(dataclasses.asdict(figures), indent=1))
    if os.environ.get("SOAK_REPORT_DIR"):
        out = Path(os.environ["SOAK_REPORT_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"soak-{line}.json").write_text(json.dumps(dataclasses.asdict(figures), indent=1))
        (out / f"soak-{line}.txt").write_text(report + "\n")
    # Each kind of event happened, and the sidecar scanned all along.
    for name in ("delete_records", "topic_deletions", "moves", "restarts", "kills", "rolls", "retention_deletions"):
        assert getattr(figures, name) > 0 or figures.failures, f"no {name} in the soak:\n{report}"
    assert figures.scans >= SOAK_SECONDS / 10, f"too few scans seen:\n{report}"
    assert not figures.failures, report
