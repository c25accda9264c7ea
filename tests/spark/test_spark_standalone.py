"""The jobs on a real standalone cluster (a master and two workers, ``standalone_cluster``),
submitted as a user submits them: ``spark-submit --master spark://... submit.py <job> ...``
with the installed package on every executor. The outputs are byte-identical to
``kafka-cleaner clean`` on the same input and ``--now-ms``; an executor JVM killed while a
phase runs is replaced by its worker, the task is retried, and the output is still the same
bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from kafka_logs import snapshot_dir
from spark_helpers import (
    FLEET_POLICY,
    LARGE_POLICY,
    LARGE_TP,
    NOW,
    assert_same_partitions,
    checkpoint,
    compacted,
    log_bytes,
)
from standalone_cluster import StandaloneCluster, wait_for

import cleaner.spark.submit
from cleaner.cli import main
from cleaner.config import parse_policy_text
from cleaner.spark.cli import FAULTS_ENV
from cleaner.spark.object_store import CLIENT_ENV
from cleaner.spark.report import STATUS_COLUMNS
from cleaner.spark.staging import MANIFEST

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]

SUBMIT_APP = Path(cleaner.spark.submit.__file__)
"""The application file, from the installed package (docs/spark.md: every executor has it)."""
JOB_WITHIN_S = 300


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = StandaloneCluster(tmp_path_factory.mktemp("standalone"))
    try:
        yield c.start()
    finally:
        c.stop()


def policy_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    return p


def submit(
    cluster: StandaloneCluster, cwd: Path, *args: str, s3: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``spark-submit`` of a job; ``s3``: the object store's environment, for the driver and
    (``spark.executorEnv``) the executors, as a user passes credentials to both."""
    done = subprocess.run(
        cluster.submit_command(SUBMIT_APP, *args, executor_env=s3),
        env={**cluster.env(), **(s3 or {})},
        cwd=cwd,
        capture_output=True,
        timeout=JOB_WITHIN_S,
    )
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    return done


def test_report_on_the_cluster_agrees_with_status_and_a_clean(cluster, tmp_path, fleet, fleet_cleaned):
    before = snapshot_dir(fleet)
    policy = policy_file(tmp_path, FLEET_POLICY)
    out = tmp_path / "report"
    submit(
        cluster, tmp_path, "report", str(fleet), "--policy", str(policy), "--now-ms", str(NOW),
        "--output", str(out), "--format", "json",
    )  # fmt: skip
    assert snapshot_dir(fleet) == before
    rows = [json.loads(line) for p in (out / "partitions").glob("part-*.json") for line in p.read_text().splitlines()]
    printed = CliRunner().invoke(main, ["status", str(fleet), "--policy", str(policy), "--now-ms", str(NOW), "--json"])
    assert printed.exit_code == 0, printed.output
    status = {(s["topic"], s["partition"]): s for s in json.loads(printed.output)}
    assert len(rows) == len(status) == 10
    for row in rows:
        s = status[(row["topic"], row["partition"])]
        assert {name: _without_nulls(row.get(name)) for name, _ in STATUS_COLUMNS} == {
            name: _without_nulls(s.get(name)) for name, _ in STATUS_COLUMNS
        }
        directory = f"{row['topic']}-{row['partition']}"
        if s["compacted"]:
            reclaimed = log_bytes(fleet / directory) - log_bytes(fleet_cleaned / directory)
            assert row["reclaimableBytes"] == reclaimed > 0


def test_compact_on_the_cluster_is_byte_identical(cluster, tmp_path, fleet, fleet_cleaned, object_store, monkeypatch):
    """``compact`` of the fleet's log dir copied to a real S3-compatible store (rclone's layout,
    each file's mtime in its metadata) into that store, the credentials passed to the driver
    and the executors as a user passes them: each executor mirrors the partitions of its tasks
    onto its own local directory and uploads what it cleaned, the driver writes ``_SUCCESS``,
    and the output is the bytes of ``kafka-cleaner clean``. (``compact`` of a log dir on disk
    into a directory: tests/spark/test_spark_compact.py, the same code.)"""
    bucket = f"standalone-{uuid.uuid4().hex[:8]}"
    object_store.client().create_bucket(Bucket=bucket)
    uri, out = f"s3://{bucket}/b1/data", f"s3://{bucket}/cleaned"
    object_store.upload_log_dir(fleet, uri)
    policy = policy_file(tmp_path, FLEET_POLICY)
    submit(cluster, tmp_path, "compact", uri, "--policy", str(policy), "--output", out, "--now-ms", str(NOW),
           "--staging", str(tmp_path / "staging"), s3=object_store.env())  # fmt: skip
    assert object_store.client().head_object(Bucket=bucket, Key="cleaned/_SUCCESS")["ContentLength"] > 0
    for name in CLIENT_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in object_store.env().items():
        monkeypatch.setenv(name, value)
    fetched = object_store.download_log_dir(f"{out}/data", tmp_path / "fetched" / "data")
    tps = compacted(fleet, parse_policy_text(FLEET_POLICY))
    assert_same_partitions(fleet_cleaned, fetched, tps)
    assert checkpoint(fetched) == checkpoint(fleet_cleaned)


def test_compact_large_survives_an_executor_killed_mid_phase(cluster, tmp_path, large, large_cleaned, object_store):
    """The partition copied to the object store: the driver plans on a hollow mirror and each
    executor makes whole in its own the segments its tasks read (``object_store.fill``).
    Phase 2 has begun when a task made its attempt directory in the run's staging area;
    its tasks are held there (a fault-injection hold, released by a file) while the executor
    JVM is SIGKILLed, so the job cannot finish first (it did once, in a fresh-clone CI run: the
    whole phase ran between two looks). Its worker starts a new executor (a third executor
    directory of the application, with an empty mirror), the lost tasks run again, and the
    round is the same bytes. (compact-large of a partition on disk: test_spark_compact_large.py.)"""
    bucket = f"standalone-{uuid.uuid4().hex[:8]}"
    object_store.client().create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/b1/data"
    object_store.upload_log_dir(large, uri)
    out = tmp_path / "out"
    staging = tmp_path / "staging"
    release = tmp_path / "release-phase-2"
    policy = policy_file(tmp_path, LARGE_POLICY)
    apps_before = app_dirs(cluster)
    job = subprocess.Popen(
        cluster.submit_command(
            SUBMIT_APP, "compact-large", f"{uri}/{LARGE_TP.dir_name}", "--policy", str(policy),
            "--output", str(out), "--staging", str(staging), "--now-ms", str(NOW),
            executor_env=object_store.env(),
        ),
        env={**cluster.env(), **object_store.env(),
             FAULTS_ENV: json.dumps({"hold": {"point": "phase2", "until": str(release)}})},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:

        def phase2_running() -> list[int] | None:
            runs = list(staging.glob("compact-large-*")) if staging.is_dir() else []
            started = any(any((run / "attempts").glob("*")) for run in runs if (run / "attempts").is_dir())
            pids = [pid for pid, app in cluster.executor_pids().items() if app not in apps_before]
            return pids if started and pids else None

        pids = wait_for("phase 2 of compact-large", phase2_running, JOB_WITHIN_S, [*cluster.procs, job])
        (run,) = staging.iterdir()
        os.kill(pids[0], signal.SIGKILL)
        assert not (run / MANIFEST).exists(), "the job finished before the executor was killed"
        release.touch()
        _, stderr = job.communicate(timeout=JOB_WITHIN_S)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, stderr.decode()[-4000:]
    assert_same_partitions(large_cleaned, out, [LARGE_TP])
    assert checkpoint(out) == checkpoint(large_cleaned)
    # The application's executors: two at the start, and the one the worker started again.
    (app,) = set(app_dirs(cluster)) - set(apps_before)
    executors = [d for w in cluster.base.glob("worker-*") for d in (w / app).glob("*") if d.is_dir()]
    assert len(executors) >= 3, executors


def app_dirs(cluster: StandaloneCluster) -> list[str]:
    """The applications the workers ran executors for (``<work dir>/<app id>/<executor id>``)."""
    return sorted({d.name for w in cluster.base.glob("worker-*") for d in w.iterdir() if d.is_dir()})


def _without_nulls(value: object) -> object:
    """A struct column's JSON leaves out its null fields; status --json writes them as null."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value
