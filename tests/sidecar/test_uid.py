"""The writing modes run only as a uid whose files the broker can open (``guards.mode_refusal``):
the broker's files belong to 1001 (Strimzi, Bitnami) or 1000 (Confluent). A sidecar of another
uid refuses compact and stage mode at start-up with the reason in ``/status`` (a warning, an
error, ``cleaner.state: error``), opens its gate at once (the broker never waits for it),
writes nothing, and keeps observing. The same sidecar as the owner compacts."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from run_as import as_user
from sidecar_helpers import ALWAYS, finish_pass, new_sidecar, next_scan, write_policy

from cleaner.config import Mode
from cleaner.sidecar.guards import mode_refusal

ALL = [{"match": ".*", "cleanupPolicy": "compact"}]
GENERATED = {"topics": 1, "partitions": 2, "records": 3_000, "keys": 300}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the broker's files to another uid")


def _files(log_dir: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root, _dirs, names in os.walk(log_dir):
        for n in names:
            st = (Path(root) / n).stat()
            out[str(Path(root) / n)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def broker_files(make_log_dir, request: pytest.FixtureRequest):
    """``owned_by(uid)``: a generated log dir, every file the broker's (uid/gid ``uid``), under a
    directory every uid may traverse (pytest's tmp_path is root's alone)."""
    shared = Path(tempfile.mkdtemp(prefix="kafka-cleaner-uid-"))
    shared.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))

    def owned_by(uid: int) -> tuple[Path, Path]:
        data = Path(shutil.move(make_log_dir(**GENERATED), shared / "kafka-logs"))
        for root, dirs, names in os.walk(data):
            for n in dirs + names:
                os.chown(Path(root) / n, uid, uid)
            os.chmod(root, 0o775)
        os.chown(data, uid, uid)
        return shared, data

    return owned_by


def test_compact_as_another_uid_is_refused_and_observing_goes_on(broker_files) -> None:
    shared, data = broker_files(1001)
    policy = write_policy(shared / "policy.yaml", mode="compact", topics=ALL, compact=ALWAYS)
    before = _files(data)
    sc = new_sidecar(policy, [data])  # as root: not the owner either
    doc = next_scan(sc)
    doc = next_scan(sc)
    why = "compact mode refused: the sidecar runs as uid 0, but the broker's files in"
    assert doc["cleaner"]["state"] == "error" and doc["gate"]["state"] == "open", doc["cleaner"]
    assert doc["gate"]["skipped"].startswith(why)
    assert any(w.startswith(why) and "uid 1001" in w for w in doc["warnings"]), doc["warnings"]
    assert any(e["message"].startswith(why) for e in doc["errors"])
    assert sc._controller.pool is None and not sc._controller.held_locks()
    assert _files(data) == before, "a refused mode wrote"
    # Observing goes on: the scan reports the partitions, cleanable as they are.
    assert doc["scannedAt"] is not None and sum(d["partitions"] for d in doc["logDirs"]) == 2
    assert any(p["cleanableBytes"] > 0 for p in doc["partitions"])

    # As observe, nothing is refused.
    write_policy(policy, mode="observe", topics=ALL, generation=2)
    doc = next_scan(sc, 30_000)
    assert doc["cleaner"]["state"] == "observing" and "warnings" not in doc


def test_compact_as_the_owner_cleans(broker_files) -> None:
    shared, data = broker_files(1001)
    policy = write_policy(shared / "policy.yaml", mode="compact", topics=ALL, compact=ALWAYS)
    policy.chmod(0o644)

    def as_broker() -> dict:
        assert mode_refusal(Mode.COMPACT, [data]) is None
        sc = new_sidecar(policy, [data], scan_ms=1_000)
        sc.tick()
        finish_pass(sc)
        doc = next_scan(sc, 1_000)
        sc.stop()
        return {"state": doc["cleaner"]["state"], "warnings": doc.get("warnings"),
                "reclaimed": doc["cleaner"]["bytesReclaimedTotal"]}

    result = as_user(1001, 1001, [], as_broker)
    assert result["warnings"] is None and result["state"] != "error" and result["reclaimed"] > 0, result
    owners = {(Path(root) / n).stat().st_uid for root, _d, names in os.walk(data) for n in names}
    assert owners == {1001}, owners


def test_stage_as_a_uid_without_the_brokers_group_is_refused(broker_files) -> None:
    """Stage mode reuses the stage guard's own uid check (``stage.uid_refusal``): another uid
    may stage only with the broker's group (the pod's fsGroup), and root hands files over."""
    shared, data = broker_files(1000)  # Confluent's uid
    policy = write_policy(shared / "policy.yaml", mode="stage", topics=ALL)
    policy.chmod(0o644)
    assert mode_refusal(Mode.STAGE, [data]) is None  # root chowns what it stages

    def as_other(groups: list[int]):
        def run() -> dict:
            sc = new_sidecar(policy, [data])
            doc = next_scan(sc)
            return {"state": doc["cleaner"]["state"], "warnings": doc.get("warnings", []),
                    "gate": doc["gate"]["state"]}
        return as_user(65532, 65532, groups, run)

    before = _files(data)
    refused = as_other([])
    assert refused["state"] == "error" and refused["gate"] == "open", refused
    assert any(w.startswith(f"stage mode refused in {data}") and "uid 65532" in w for w in refused["warnings"])
    assert _files(data) == before
    allowed = as_other([1000])
    assert allowed["state"] != "error" and not allowed["warnings"], allowed
