"""A sidecar one minor version older than the operator keeps working (docs/operator.md,
"Version skew"): the policy file a newer operator writes has fields this sidecar does not
know. It ignores them, says so once (log and ``/status`` warning), and loads the new
generation, so the policy never stalls on ``AwaitingPolicy``. "New" is simulated by adding
fields no version has; everything else stays as strict as ``kubectl``'s validation."""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

import pytest
import yaml
from compaction_operator.status import BrokerPod, Outcome, Scrape, build_status, parse_report
from sidecar_helpers import new_sidecar, next_scan, policy_manifest, status_of

from cleaner.config import parse_policy_text
from cleaner.errors import PolicyError
from cleaner.sidecar import service

POLL_MS = service.POLICY_POLL_MS
NEW_FIELDS = ["spec.futureSection", "spec.cleaner.futureKnob", "spec.topics[0].tieredHint", "spec.sidecar.futureOption"]


def newer_manifest(generation: int) -> dict:
    """What an operator with a newer CRD writes: known fields plus some this version lacks."""
    manifest = policy_manifest("observe", generation)
    spec = manifest["spec"]
    spec["futureSection"] = {"strategy": "Paced"}
    spec["cleaner"]["futureKnob"] = 3
    spec["topics"][0]["tieredHint"] = "local"
    spec["sidecar"] = {"port": 9410, "futureOption": [{"name": "registry"}]}
    return manifest


def write(path: Path, manifest: dict) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(manifest, sort_keys=False))
    os.replace(tmp, path)
    return path


def test_an_old_sidecar_reads_a_new_policy(tmp_path: Path, make_log_dir, caplog: pytest.LogCaptureFixture) -> None:
    data = make_log_dir(topics=1, partitions=1)
    policy = write(tmp_path / "policy.yaml", policy_manifest("observe", 1))
    sc = new_sidecar(policy, [data])
    assert next_scan(sc)["policyGeneration"] == 1

    caplog.set_level(logging.WARNING, logger="cleaner.sidecar")
    write(policy, newer_manifest(2))
    doc = next_scan(sc, POLL_MS)
    assert doc["policyGeneration"] == 2 and doc["mode"] == "observe" and doc["scannedAt"] is not None
    [warning] = doc["warnings"]
    assert "policy generation 2" in warning and all(f in warning for f in NEW_FIELDS), warning
    assert not any("policy:" in e["message"] for e in doc["errors"]), doc["errors"]
    # Known fields still count: the known part of the new file is the policy.
    assert sc.policy is not None and sc.policy.sidecar.port == 9410 and sc.policy.topics[0].match == "topic-.*"

    # Warned once: the same unknown fields in the next generation log nothing new.
    manifest = newer_manifest(3)
    manifest["spec"]["reporting"] = {"topPartitions": 5}
    write(policy, manifest)
    assert next_scan(sc, POLL_MS)["policyGeneration"] == 3
    logged = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(logged) == 1 and "spec.futureSection" in logged[0], logged

    # The operator's side: the report validates, and the policy is Ready, not AwaitingPolicy.
    scrape = parse_report(status_of(sc), "kafka-0")
    assert scrape.error is None, scrape.error
    status = build_status(policy=parse_policy_text(yaml.safe_dump(policy_manifest("observe", 3))), generation=3,
                          previous=None, outcome=Outcome(), pods=[BrokerPod("kafka-0", has_sidecar=True)],
                          scrapes={"kafka-0": Scrape(report=scrape.report)}, sidecar_hash=None,
                          now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready

    # Back to a file this version knows whole: the warning goes.
    write(policy, policy_manifest("observe", 4))
    doc = next_scan(sc, POLL_MS)
    assert doc["policyGeneration"] == 4 and "warnings" not in doc


def test_only_the_sidecar_ignores_unknown_fields() -> None:
    """The CLI and the operator stay strict (the API server's strict field validation), and
    the sidecar's leniency covers unknown *fields* only: a bad value of a known field, or an
    apiVersion it does not read, are errors for it too (it keeps its last good policy)."""
    text = yaml.safe_dump(newer_manifest(2))
    with pytest.raises(PolicyError, match="unknown field 'futureSection'"):
        parse_policy_text(text)
    unknown: list[str] = []
    parse_policy_text(text, unknown_fields=unknown)
    assert sorted(unknown) == sorted(NEW_FIELDS)
    bad = newer_manifest(2)
    bad["spec"]["cleaner"]["threads"] = 0
    with pytest.raises(PolicyError, match=r"spec\.cleaner\.threads"):
        parse_policy_text(yaml.safe_dump(bad), unknown_fields=[])
    with pytest.raises(PolicyError, match="apiVersion"):
        parse_policy_text(yaml.safe_dump({**newer_manifest(2), "apiVersion": "kafkacleaner.io/v1beta1"}),
                          unknown_fields=[])
