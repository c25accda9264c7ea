"""A real Prometheus server scrapes the sidecar's /metrics; its query API returns the
values /status reports, and the values ``kafka-cleaner status`` computes in a process of its
own from the same log dir (so a bug shared by the sidecar's report and its metrics, which
come from one snapshot, cannot cancel out)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections import defaultdict
from pathlib import Path

import pytest
from ports import free_port
from sidecar_helpers import http_get, sidecar_process, write_policy

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def _query(base: str, promql: str) -> list[dict]:
    code, body, _ = http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert code == 200, body
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _until_ready(base: str, prometheus: subprocess.Popen, log: Path) -> None:
    """Until Prometheus says it is ready (``/-/ready``): its web server listens before its TSDB
    has started, and answers 503 to queries until then (a loaded run's first query got one)."""
    deadline = time.monotonic() + 60
    while True:
        assert prometheus.poll() is None, log.read_text()[-3000:]
        try:
            if http_get(f"{base}/-/ready")[0] == 200:
                return
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < deadline, "Prometheus was not ready within 60 s:\n" + log.read_text()[-3000:]
        time.sleep(0.1)


@pytest.mark.skipif(
    not os.access(PROMETHEUS, os.X_OK),
    reason="Prometheus is not installed (Debian package `prometheus`; `make test` installs it)",
)
def test_prometheus_scrapes_what_status_reports(tmp_path: Path, make_log_dir) -> None:
    # Past the generator's first 1 MiB chunk per partition, which holds no tombstones.
    data = make_log_dir(topics=3, partitions=2, records=12_000)
    policy = write_policy(tmp_path / "policy.yaml", mode="observe", generation=42)
    with sidecar_process(
        policy, [data], "--scan-interval-ms", "500", "--now-ms", "1700000000000", log_file=tmp_path / "sidecar.log"
    ) as sidecar:
        status = sidecar.wait_for(lambda d: d["scannedAt"] is not None, what="the first scan")
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: kafka-cleaner\n"
            "    scrape_interval: 1s\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{sidecar.port}']}}]\n"
        )
        log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115
        prometheus = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            _until_ready(base, prometheus, tmp_path / "prometheus.log")
            deadline = time.monotonic() + 60
            result: list[dict] = []
            while time.monotonic() < deadline:
                assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
                try:
                    result = _query(base, 'kafka_cleaner_policy_generation{job="kafka-cleaner"}')
                except OSError:
                    result = []
                if result:
                    break
                time.sleep(0.25)
            assert result, "Prometheus never scraped the sidecar:\n" + (tmp_path / "prometheus.log").read_text()[-3000:]
            targets = json.loads(http_get(f"{base}/api/v1/targets")[1])["data"]["activeTargets"]
            assert [t["health"] for t in targets] == ["up"], targets

            status = sidecar.status()  # the scrape and /status see the same (unchanging) scan
            assert float(result[0]["value"][1]) == status["policyGeneration"] == 42
            (ratio,) = _query(base, "kafka_cleaner_max_dirty_ratio")
            assert float(ratio["value"][1]) == pytest.approx(status["cleaner"]["maxDirtyRatio"], abs=1e-6)
            by_topic = {
                r["metric"]["topic"]: float(r["value"][1])
                for r in _query(base, "sum by (topic) (kafka_cleaner_topic_cleanable_bytes)")
            }
            assert by_topic == {t["topic"]: t["cleanableBytes"] for t in status["topics"]}
            dirty = {
                r["metric"]["topic"]: float(r["value"][1]) for r in _query(base, "kafka_cleaner_topic_dirty_bytes")
            }
            assert dirty == {t["topic"]: t["dirtyBytes"] for t in status["topics"]}
            (total,) = _query(base, "sum(kafka_cleaner_topic_cleanable_bytes)")
            assert float(total["value"][1]) == sum(t["cleanableBytes"] for t in status["topics"])
            (uncleanable,) = _query(base, "kafka_cleaner_uncleanable_partitions")
            assert uncleanable["metric"]["log_dir"] == status["logDirs"][0]["path"]
            assert float(uncleanable["value"][1]) == status["logDirs"][0]["uncleanablePartitions"]
            (dead,) = _query(base, "kafka_cleaner_dead_threads")
            assert float(dead["value"][1]) == status["cleaner"]["deadThreads"]
            (scanned,) = _query(base, "kafka_cleaner_last_scan_timestamp_seconds")
            assert float(scanned["value"][1]) == 1_700_000_000.0  # the sidecar's --now-ms

            # The same figures from `kafka-cleaner status` in a process of its own.
            command = Path(sys.executable).with_name("kafka-cleaner")
            cli = subprocess.run(
                [str(command), "status", str(data), "--policy", str(policy), "--now-ms", "1700000000000", "-o", "json"],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            expected: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            for row in json.loads(cli.stdout):
                topic = expected[row["topic"]]
                topic["cleanable"] += row["cleanableBytes"]
                topic["clean"] += row["cleanBytes"]
                topic["dirty"] += row["sizeBytes"] - row["cleanBytes"]
                topic["tombstones"] += row["tombstones"]
                topic["ratio"] = max(topic["ratio"], row["cleanableRatio"])
            assert len(expected) == 3 and all(t["dirty"] > 0 for t in expected.values())
            assert any(t["tombstones"] > 0 for t in expected.values())
            for family, key in [
                ("kafka_cleaner_topic_cleanable_bytes", "cleanable"),
                ("kafka_cleaner_topic_clean_bytes", "clean"),
                ("kafka_cleaner_topic_dirty_bytes", "dirty"),
                ("kafka_cleaner_topic_tombstones", "tombstones"),
            ]:
                scraped = {r["metric"]["topic"]: float(r["value"][1]) for r in _query(base, family)}
                assert scraped == {t: v[key] for t, v in expected.items()}, family
            assert float(ratio["value"][1]) == pytest.approx(max(t["ratio"] for t in expected.values()), abs=1e-6)
        finally:
            prometheus.terminate()
            try:
                prometheus.wait(15)
            except subprocess.TimeoutExpired:
                prometheus.kill()
                prometheus.wait()
            log.close()
