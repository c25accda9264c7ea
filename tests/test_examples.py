"""Every example under ``examples/`` does what its comments say, run with the product's own code:
the file itself is the policy (loaded by the parser the CLI, the sidecar and the operator share),
the in-process sidecar (``cleaner.sidecar.service.Sidecar`` under a ``MockTime``) or the real CLI
(``kafka-cleaner`` through click's CliRunner) acts on a log dir written by ``cleaner.generate``
whose topics are renamed to the ones the example names (``__consumer_offsets``, ...), and a
broker is played by another process holding the log dir's ``.lock`` (``broker_lock``).

Each test's docstring lists the claims of the example's comments that its assertions check.

What cannot be checked here, and why:

- the Kubernetes side of every manifest: the Bitnami chart's names (StatefulSet
  ``kafka-controller``, volume ``data`` at ``/bitnami/kafka``), Strimzi's labels, the operator's
  injection and rollout (``injection``, ``rollout``: see tests/operator and tests/k8s), the
  sidecar's ``resources``. ``tests/test_crd.py`` admits every example as the API server would;
  here only the log dir the operator would hand the sidecar (``mountPath``/``logDirs``) is used;
- ``compact-consumer-offsets-offline.yaml``'s ``helm upgrade ... diagnosticMode.enabled=...`` and
  ``kubectl get cpol -w``: no cluster, no chart. What the diagnostic mode does to the log dir
  (the broker process gone, the pod and its sidecar still running) is played by releasing the
  broker's ``.lock`` under a running sidecar; "Max Dirty" is the sidecar's ``/status``
  ``maxDirtyRatio``, which the operator aggregates;
- the throttles (``maxIoBytesPerSecond``) and the sizes of the dedupe buffers: the files use them
  as written (a pass allocates them), their effect on speed is not measured;
- ``examples/spark/spark-application.yaml`` is not a policy: ``tests/spark/test_spark_application.py``
  runs what the spark-operator would hand to ``submit.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "sidecar"))

from broker_lock import BrokerLock, lock_is_free_for_another_process
from kafka_logs import consumer_view, leftover_files, read_records, snapshot_dir
from sidecar_helpers import SimBroker, finish_pass, next_scan, status_of, topic_entry

from cleaner.clock import MockTime
from cleaner.config import Policy, load_policy
from cleaner.generate import GeneratorConfig, generate
from cleaner.sidecar.service import Sidecar, SidecarOptions
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.topic_partition import TopicPartition, parse_partition_dir
from cleaner.windows import in_window

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
NOW_MS = 1_700_000_000_000
"""The generator's clock (records end here) and the sidecars' ``MockTime`` at the start."""
SMALL = {"partitions": 2, "records": 2_000, "keys": 200, "segment_bytes": 32 * 1024}
"""Generated partitions with several closed segments and a dirty ratio well above 0.5."""


def example(name: str) -> Path:
    return EXAMPLES / name


# -- a generated log dir with the example's topics --------------------------------------------


def log_dir_with_topics(path: Path, topics: Iterable[str], **options: Any) -> Path:
    """``cleaner.generate``'s broker log dir whose topics are named ``topics`` (the generator
    names them ``topic-<i>``): each partition dir renamed, each checkpoint file rewritten
    (``partition.metadata`` holds the topic id, not its name)."""
    names = list(topics)
    generate(path, GeneratorConfig(**{**SMALL, **options, "topics": len(names), "now_ms": NOW_MS}))
    rename = {f"topic-{i}": name for i, name in enumerate(names)}
    for entry in sorted(path.iterdir()):
        tp = parse_partition_dir(entry.name) if entry.is_dir() else None
        if tp is not None:
            entry.rename(path / TopicPartition(rename[tp.topic], tp.partition).dir_name)
    for f in path.glob("*-checkpoint"):
        checkpoint = OffsetCheckpointFile(f)
        checkpoint.write({TopicPartition(rename[tp.topic], tp.partition): o for tp, o in checkpoint.read().items()})
    return path


def topic_files(log_dir: Path, topic: str) -> dict[str, tuple[bytes, int]]:
    """Bytes and mtime of every file of ``topic``'s partition dirs."""
    return {k: v for k, v in snapshot_dir(log_dir).items() if _topic_of(k) == topic}


def _topic_of(relative: str) -> str | None:
    tp = parse_partition_dir(Path(relative).parts[0]) if len(Path(relative).parts) > 1 else None
    return tp.topic if tp is not None else None


def live_records(log_dir: Path) -> dict[str, dict]:
    """Per partition dir, what a consumer reading it from the start ends up with."""
    out = {}
    for pdir in sorted(p for p in log_dir.iterdir() if p.is_dir()):
        view = consumer_view(pdir)
        assert view.problems == [], (pdir.name, view.problems)
        out[pdir.name] = view.live
    return out


def cleaned_partitions(log_dir: Path) -> set[str]:
    """The partitions in ``cleaner-offset-checkpoint``: those a clean has finished."""
    path = log_dir / CLEANER_OFFSET_CHECKPOINT
    return {str(tp) for tp in OffsetCheckpointFile(path).read()} if path.exists() else set()


def sidecar(policy: Path, log_dirs: Iterable[Path | str], clock: MockTime | None = None) -> Sidecar:
    """The sidecar as the operator starts it: the policy file as written (the ConfigMap holds
    the manifest), scans at the policy's ``reporting.intervalSeconds``, a free loopback port."""
    options = SidecarOptions(
        policy, [str(d) for d in log_dirs], broker_name="kafka-controller-0", listen=("127.0.0.1", 0)
    )
    return Sidecar(options, clock or MockTime(NOW_MS))


def run_gate(sc: Sidecar) -> dict[str, Any]:
    """The pod's start: the sidecar's first tick runs its start-up gate (compact: one pass over
    the log dirs whose lock is free); returns /status once the gate is open."""
    sc.tick()
    for _ in range(3):
        if sc.gate.open:
            return status_of(sc)
        finish_pass(sc)  # joins the gate pass's threads (with a deadline naming them), then ticks
    raise AssertionError(f"the start-up gate is still {sc.gate.state} after its pass ended")


def max_dirty(doc: dict[str, Any], topic: str) -> float:
    return float(topic_entry(doc, topic)["maxDirtyRatio"])


# -- compact-consumer-offsets-offline.yaml ----------------------------------------------------

OFFLINE = example("compact-consumer-offsets-offline.yaml")
INTERNAL = ("__consumer_offsets", "__transaction_state")


def test_offline_waits_while_the_broker_runs_and_compacts_once_its_process_stops(tmp_path: Path) -> None:
    """compact-consumer-offsets-offline.yaml, next to a broker whose process then stops while
    its pod (and so the sidecar) stays, as with the Bitnami chart's diagnostic mode:

    - "mode compact cleans a log dir only while the sidecar holds the dir's .lock, so never
      while a broker runs on it": while another process holds ``.lock``, no file changes;
    - "the sidecar reports waitingForBroker and retries": every scan, past ``backoffMs``,
      says ``waitingForBroker`` and ``lockHeldByBroker``;
    - "A window opens when the broker process stops but the pod (and its volume) stays": with
      the same sidecar still running, the lock released is taken and ``__consumer_offsets``
      and ``__transaction_state`` are compacted ("watch Max Dirty fall": their
      ``maxDirtyRatio`` falls), their records as a consumer reads them unchanged;
    - ``topics`` names only those two: a third topic's files stay byte-identical;
    - "brokers return": between passes the lock is free, and once a broker holds it again the
      sidecar is back to ``waitingForBroker``.

    Failed before the example had ``compact.windows`` (only the start-up gate compacts, and
    here the broker held the lock at the gate): the state was ``idle`` at the first scan."""
    data = log_dir_with_topics(tmp_path / "data", [*INTERNAL, "orders"])
    before = live_records(data)
    broker = BrokerLock(data).acquire()
    try:
        sc = sidecar(OFFLINE, [data])
        sc.tick()  # the pod starts next to a running broker: the gate finds the lock held
        doc = status_of(sc)
        assert doc["mode"] == "compact"
        assert doc["gate"]["state"] == "open" and doc["gate"]["lockHeldByBroker"] == [str(data)]
        untouched = snapshot_dir(data)
        dirty = {t: max_dirty(doc, t) for t in INTERNAL}
        assert all(r > 0.5 for r in dirty.values()), dirty
        policy = sc.policy
        assert policy is not None
        interval_ms = policy.reporting.interval_seconds * 1000
        for _ in range(policy.cleaner.backoff_ms // interval_ms + 2):  # past backoffMs: it has retried
            doc = next_scan(sc, interval_ms)
            assert doc["cleaner"]["state"] == "waitingForBroker", doc["cleaner"]
            assert doc["logDirs"][0]["lockHeldByBroker"] is True
            assert doc["compact"]["inWindow"] is True
            assert snapshot_dir(data) == untouched, "the sidecar changed a log dir a broker holds"
    finally:
        broker.release()  # the diagnostic mode: the broker process is gone, the pod stays

    orders = topic_files(data, "orders")
    doc = next_scan(sc, policy.cleaner.backoff_ms)
    assert doc["cleaner"]["state"] == "cleaning", doc["cleaner"]
    assert not lock_is_free_for_another_process(data), "cleaning without holding .lock"
    finish_pass(sc)
    doc = next_scan(sc, 1_000)
    assert doc["errors"] == [] and doc["cleaner"]["state"] == "idle"
    for topic in INTERNAL:
        assert max_dirty(doc, topic) < dirty[topic] and max_dirty(doc, topic) == 0.0, topic
    assert cleaned_partitions(data) == {f"{t}-{p}" for t in INTERNAL for p in range(SMALL["partitions"])}
    assert topic_files(data, "orders") == orders, "a topic the policy does not name was touched"
    assert live_records(data) == before
    assert leftover_files(data) == []
    assert lock_is_free_for_another_process(data), "the lock is held between passes"

    with BrokerLock(data):  # diagnosticMode.enabled=false: the broker takes its lock again
        doc = next_scan(sc, policy.cleaner.backoff_ms)
        assert doc["cleaner"]["state"] == "waitingForBroker"


def test_offline_window_is_always_open() -> None:
    """compact-consumer-offsets-offline.yaml: the window is "always open" (any second of any
    day, UTC, read by the product's cron parser); the rest of what the comments say about
    the topics holds in the parsed policy (segment size as the brokers create them)."""
    policy = load_policy(OFFLINE)
    assert policy.compact.windows
    day_ms = 86_400_000
    instants = [0, NOW_MS, NOW_MS + 999, 4_102_444_799_999]  # 1970, 2023, 2099-12-31T23:59:59.999Z
    instants += [NOW_MS + i * 7_919_993 for i in range(2 * day_ms // 7_919_993)]  # every hour of the clock
    instants += [NOW_MS + i * 1_000 for i in range(120)]  # every second of two minutes
    assert [t for t in instants if not in_window(policy.compact.windows, t)] == []
    assert [(r.match, r.cleanup_policy, r.segment_bytes) for r in policy.topics] == [
        ("__consumer_offsets", "compact", 104_857_600),
        ("__transaction_state", "compact", 104_857_600),
    ]


def test_offline_pod_restart_compacts_in_the_gate_and_leaves_the_returning_broker_backoff_ms(
    tmp_path: Path,
) -> None:
    """compact-consumer-offsets-offline.yaml when a pod is recreated without a running broker
    (the diagnostic mode's rollout: the broker container runs ``sleep infinity``):

    - the start-up gate compacts both topics (the lock is free);
    - "when the brokers return, a broker has [backoffMs] after its pod's start-up gate to take
      its .lock before the sidecar tries again": the lock stays free until then;
    - a broker that took it meanwhile keeps it: the sidecar waits and changes nothing."""
    data = log_dir_with_topics(tmp_path / "data", [*INTERNAL, "orders"])
    sc = sidecar(OFFLINE, [data])
    doc = run_gate(sc)
    assert doc["gate"]["compacted"] == 2 * SMALL["partitions"] and doc["gate"]["timedOut"] is False
    assert cleaned_partitions(data) == {f"{t}-{p}" for t in INTERNAL for p in range(SMALL["partitions"])}
    assert all(max_dirty(doc, t) == 0.0 for t in INTERNAL)
    policy = sc.policy
    assert policy is not None
    interval_ms = policy.reporting.interval_seconds * 1000
    for _ in range(policy.cleaner.backoff_ms // interval_ms - 1):
        doc = next_scan(sc, interval_ms)
        assert doc["cleaner"]["state"] == "idle"
        assert lock_is_free_for_another_process(data), "the sidecar took the lock again before backoffMs"
    with BrokerLock(data):  # the broker is back before backoffMs
        cleaned = snapshot_dir(data)
        for _ in range(3):
            doc = next_scan(sc, policy.cleaner.backoff_ms)
            assert doc["cleaner"]["state"] == "waitingForBroker"
        assert snapshot_dir(data) == cleaned


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own the files as the broker's uid and fork as it")
def test_offline_runs_as_the_broker_uid_so_cleaned_files_keep_their_owner(request: pytest.FixtureRequest) -> None:
    """compact-consumer-offsets-offline.yaml's ``securityContext``: "The Bitnami image runs
    Kafka as 1001:1001; cleaned segments must keep that owner":

    - a sidecar of another uid (here root) is refused and writes nothing;
    - the sidecar running as the example's ``runAsUser``/``runAsGroup`` compacts, and every
      file in the log dir, rewritten or new, belongs to 1001:1001."""
    from run_as import as_user

    policy = load_policy(OFFLINE)
    context = policy.sidecar.security_context
    assert context is not None
    uid, gid = context.run_as_user, context.run_as_group
    assert (uid, gid) == (1001, 1001) and context.run_as_non_root is True
    shared = Path(tempfile.mkdtemp(prefix="kafka-cleaner-examples-"))  # tmp_path is root's alone
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    shared.chmod(0o755)
    data = log_dir_with_topics(shared / "data", [*INTERNAL, "orders"])
    for root, dirs, files in os.walk(data):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, uid, gid)
    policy_file = shared / "policy.yaml"
    shutil.copy(OFFLINE, policy_file)
    policy_file.chmod(0o644)

    as_root = sidecar(policy_file, [data])
    before = snapshot_dir(data)
    as_root.tick()
    doc = next_scan(as_root, policy.cleaner.backoff_ms)
    assert doc["cleaner"]["state"] == "error"
    assert any("runAsUser" in e["message"] for e in doc["errors"]), doc["errors"]
    assert snapshot_dir(data) == before

    def compact_as_the_broker() -> dict[str, Any]:
        return run_gate(sidecar(policy_file, [data]))

    doc = as_user(uid, gid, [], compact_as_the_broker)
    assert doc["errors"] == [] and doc["gate"]["compacted"] == 2 * SMALL["partitions"]
    assert cleaned_partitions(data) == {f"{t}-{p}" for t in INTERNAL for p in range(SMALL["partitions"])}
    owners = {(p, os.lstat(p).st_uid, os.lstat(p).st_gid) for p in map(str, [data, *data.rglob("*")])}
    assert {(u, g) for _, u, g in owners} == {(uid, gid)}, sorted(o for o in owners if o[1:] != (uid, gid))


# -- observe-cluster.yaml ------------------------------------------------------------------------

OBSERVE = example("observe-cluster.yaml")
OBSERVED_TOPICS = {
    # topic -> the rule of observe-cluster.yaml that matches it (its cleanup.policy)
    "__consumer_offsets": "compact",
    "__transaction_state": "compact",
    "_schemas": "compact",
    "connect-offsets": "compact",
    "word-count-store-changelog": "compact",
    "word-count-repartition": "delete",  # Kafka Streams' repartition topics are delete topics
    "orders": "delete",
}


def test_observe_reads_only_and_reports_every_topic(tmp_path: Path) -> None:
    """observe-cluster.yaml next to a live broker (it holds ``.lock`` and appends):

    - "read only, safe next to live brokers": after every scan the log dir is byte-identical
      to what the broker left (nothing created, not even a ``.lock``);
    - "The internal topics and the usual compacted families (Schema Registry, Connect,
      Streams) are reported with their dirty ratios": each has a topic entry with a
      ``maxDirtyRatio`` and a next clean that frees bytes;
    - "Everything else: reported, never compacted": ``orders`` and the Streams repartition
      topic are reported, and no clean is predicted for them;
    - ``perPartitionMetrics: true`` on the internal topics only: per-partition series for them;
    - ``reporting.intervalSeconds: 30`` and ``topPartitions: 20``: a scan every 30 s of the
      clock, at most 20 partitions listed."""
    data = log_dir_with_topics(
        tmp_path / "data", OBSERVED_TOPICS, partitions=5, records=600, keys=100, segment_bytes=8 * 1024
    )
    policy = load_policy(OBSERVE)
    assert policy.reporting.interval_seconds == 30 and policy.reporting.top_partitions == 20
    with BrokerLock(data):
        broker = SimBroker(data, seed=3)
        try:
            sc = sidecar(OBSERVE, [data])
            sc.tick()
            doc = status_of(sc)
            assert doc["mode"] == "observe" and doc["cleaner"]["state"] == "observing"
            first_scan = doc["scannedAt"]
            tp = TopicPartition("__consumer_offsets", 0)
            for i in range(4):
                broker.append(tp, 20, tombstones=2)
                if i == 1:
                    broker.roll(tp)
                written = snapshot_dir(data)
                doc = next_scan(sc, 30_000)
                assert snapshot_dir(data) == written, "the sidecar changed a file in observe mode"
            assert doc["scannedAt"] != first_scan
        finally:
            broker.close()
    assert not (data / ".lock").exists() and not (data / CLEANER_OFFSET_CHECKPOINT).exists()

    assert {t["topic"] for t in doc["topics"]} == set(OBSERVED_TOPICS)
    for topic, cleanup in OBSERVED_TOPICS.items():
        entry = topic_entry(doc, topic)
        assert 0 < entry["maxDirtyRatio"] <= 1, entry
        if cleanup == "compact":
            assert entry["nextCleanFreedBytes"] > 0 and "cleanup.policy" in entry["fromPolicy"], entry
        else:
            assert entry["nextCleanFreedBytes"] == 0 and entry["kafkaPasses"] == 0, entry
    # 25 compacted partitions, none uncleanable (the delete topics' partitions are not listed)
    assert len(doc["partitions"]) == 20
    assert {p["topic"] for p in doc["partitions"]} <= {t for t, c in OBSERVED_TOPICS.items() if c == "compact"}
    scanned = doc["scannedAt"]
    assert next_scan(sc, 29_000)["scannedAt"] == scanned
    assert next_scan(sc, 1_000)["scannedAt"] != scanned

    series = {
        (s.labels["topic"], s.labels["partition"])
        for family in sc.metrics.registry.collect()
        if family.name == "kafka_cleaner_partition_cleanable_ratio"
        for s in family.samples
    }
    assert series == {(t, str(p)) for t in INTERNAL for p in range(5)}


# -- stage-one-topic.yaml ------------------------------------------------------------------------

STAGE = example("stage-one-topic.yaml")
STAGE_TOPICS = ["customer-profiles", "customer-profiles-archive", "orders", "__consumer_offsets"]


def strimzi_log_dir(tmp_path: Path, policy: Policy, node_id: int = 1) -> tuple[Path, str]:
    """A broker's log dir where Strimzi puts it on the example's volume
    (``<mountPath>/kafka-log<node id>``, the mount played by a directory), and the
    ``--log-dir`` the operator would give the sidecar (``<mountPath>/<logDirs[0]>``, a
    wildcard the sidecar expands)."""
    target = policy.target
    assert target is not None and target.mount_path == "/var/lib/kafka/data-0"
    mount = tmp_path / "var-lib-kafka-data-0"
    data = log_dir_with_topics(mount / f"kafka-log{node_id}", STAGE_TOPICS, hours=6.0)
    return data, str(mount / target.log_dirs[0])


def disk_with_free_ratio(monkeypatch: pytest.MonkeyPatch, ratio: float) -> None:
    """The log dir's file system as stage mode reads it (a full disk cannot be had in a test):
    ``ratio`` of 100 GiB free."""
    from cleaner.sidecar import stage

    total = 100 << 30
    monkeypatch.setattr(stage, "_disk", lambda path: (int(total * ratio), total))


def test_stage_stages_only_the_named_topic_next_to_a_live_broker_and_the_next_pod_commits_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stage-one-topic.yaml next to a live broker (it holds ``.lock``), on a log dir matched by
    the example's wildcard ``kafka-log*``:

    - "Stage compaction of one topic": only ``customer-profiles`` gets staged sets (not
      ``customer-profiles-archive``: the match is a whole-name regex, nor any other topic);
    - "Cleaned segments are staged where Kafka never looks": every file outside the stage
      areas is byte-identical while the broker runs;
    - ``minCompactionLagMs: 3600000`` "leave the last hour alone": nothing staged reaches a
      record of the last hour;
    - "committed by the sidecar's start-up gate when each broker pod next restarts": the
      next pod's sidecar (the broker stopped) commits the sets, the records a consumer reads
      are unchanged, the other topics untouched, and the lock is free for the broker."""
    from cleaner.sidecar import stage
    from cleaner.storage.log import Log

    disk_with_free_ratio(monkeypatch, 0.9)
    policy = load_policy(STAGE)
    data, pattern = strimzi_log_dir(tmp_path, policy)
    before = live_records(data)
    others = {t: topic_files(data, t) for t in STAGE_TOPICS[1:]}
    profiles = topic_files(data, "customer-profiles")
    clock = MockTime(NOW_MS)
    with BrokerLock(data):
        sc = sidecar(STAGE, [pattern], clock)
        sc.tick()
        assert sc.log_dirs == [data]
        outside = {k: v for k, v in snapshot_dir(data).items() if stage.STAGE_DIR not in Path(k).parts}
        for _ in range(2 * SMALL["partitions"] + 2):
            doc = next_scan(sc)
            now = {k: v for k, v in snapshot_dir(data).items() if stage.STAGE_DIR not in Path(k).parts}
            assert now == outside, "a file the broker reads changed"
        sets = {p.name: s for p in sorted(data.iterdir()) if p.is_dir() and (s := stage.load(p)) is not None}
        assert set(sets) == {f"customer-profiles-{p}" for p in range(SMALL["partitions"])}, doc["stage"]
        assert {p.parent.name for p in data.rglob(stage.STAGE_DIR)} <= set(sets)
        for name, staged in sets.items():
            log = Log.open(data / name, read_only=True)
            try:
                young = [r.offset for r in read_records(log) if r.timestamp > staged.created_at_ms - 3_600_000]
            finally:
                log.close()
            assert young and staged.end_offset <= min(young), (name, staged.end_offset, min(young))

    # The pod restarts: the broker has exited, the next pod's sidecar runs its gate.
    doc = run_gate(sidecar(STAGE, [pattern], clock))
    assert doc["gate"]["committed"] == len(sets), doc["gate"]
    for name, staged in sets.items():
        assert stage.load(data / name) is None, name
        assert (stage.area(data / name) / stage.CLEANED_TO).read_text() == f"{staged.end_offset}\n"
    assert topic_files(data, "customer-profiles") != profiles
    assert {t: topic_files(data, t) for t in STAGE_TOPICS[1:]} == others
    assert live_records(data) == before
    assert leftover_files(data) == []
    assert lock_is_free_for_another_process(data)


def test_stage_stops_at_25_percent_free_disk_and_requires_an_explicit_injection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stage-one-topic.yaml: "stops at 25% free disk" (``stage.minFreeDiskRatio: 0.25``, the
    README's table): with 24% free nothing is staged and ``/status`` says why; with 26% it
    stages. "``mode: stage`` requires an explicit ``injection``": without it the policy does
    not load."""
    from cleaner.config import PolicyError, parse_policy

    policy = load_policy(STAGE)
    data, pattern = strimzi_log_dir(tmp_path, policy)
    disk_with_free_ratio(monkeypatch, 0.24)
    with BrokerLock(data):
        before = snapshot_dir(data)
        sc = sidecar(STAGE, [pattern])
        sc.tick()
        for _ in range(3):
            doc = next_scan(sc)
        assert snapshot_dir(data) == before
        assert doc["cleaner"]["stagedBytes"] == 0
        assert "minFreeDiskRatio (25%)" in str(doc["stage"]), doc["stage"]
        disk_with_free_ratio(monkeypatch, 0.26)
        for _ in range(2):
            doc = next_scan(sc, 60_000)
        assert doc["cleaner"]["stagedBytes"] > 0

    manifest = yaml.safe_load(STAGE.read_text())
    del manifest["spec"]["target"]["injection"]
    with pytest.raises(PolicyError, match="injection"):
        parse_policy(manifest)


# -- policy-local.yaml ---------------------------------------------------------------------------

LOCAL = example("policy-local.yaml")
LOCAL_TOPICS = ["__consumer_offsets", "orders-eu", "word-count-store-changelog", "payments"]
DAY_MS = 86_400_000


def kafka_cleaner(*args: str) -> tuple[int, str]:
    """The command line, in-process (click's CliRunner): exit code and stdout."""
    from click.testing import CliRunner

    from cleaner.cli import main

    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout


def test_policy_local_status_and_clean_on_a_log_dir(tmp_path: Path) -> None:
    """policy-local.yaml with the two commands its comments give, on a log dir whose newest
    records are eight days old (``--now-ms`` eight days past the generator's clock):

    - "a bare policy spec for the command line": ``status`` exits 0 and reports the matched
      topics (``payments``, matched by no rule, is neither reported nor touched);
    - "on a stopped broker's volume": next to a running broker (``.lock`` held) ``status``
      works and changes nothing, ``clean`` refuses with exit 4 and changes nothing;
    - with the broker stopped, ``clean`` compacts ``__consumer_offsets``, ``orders-.*`` and
      the Streams changelog, and what a consumer reads of the compact-only topics is unchanged;
    - ``orders-.*`` "compacted, and segments older than 7 days deleted" (``retentionMs``):
      every segment of ``orders-eu`` whose newest record is older than that is gone and the
      log start moved, while the compact-only topics keep their eight-day-old records."""
    from cleaner.storage.log import Log

    data = log_dir_with_topics(tmp_path / "data", LOCAL_TOPICS)
    policy = str(LOCAL)
    now_ms = NOW_MS + 8 * DAY_MS
    now = str(now_ms)
    payments = topic_files(data, "payments")
    before = live_records(data)

    with BrokerLock(data):
        untouched = snapshot_dir(data)
        code, out = kafka_cleaner("status", str(data), "--policy", policy, "--now-ms", now, "--json")
        assert code == 0, out
        reported = json.loads(out)
        assert {p["topic"] for p in reported} == set(LOCAL_TOPICS) - {"payments"}
        assert all(p["eligible"] for p in reported), [(p["topic"], p["reason"]) for p in reported]
        code, out = kafka_cleaner("clean", str(data), "--policy", policy, "--now-ms", now, "--json")
        assert code == 4, out
        assert snapshot_dir(data) == untouched

    code, out = kafka_cleaner("clean", str(data), "--policy", policy, "--now-ms", now, "--json")
    assert code == 0, out
    summary = json.loads(out)
    assert {c["topic"] for c in summary["cleans"]} == set(LOCAL_TOPICS) - {"payments"}
    assert summary["bytesAfter"] < summary["bytesBefore"]
    assert topic_files(data, "payments") == payments
    assert leftover_files(data) == []
    after = live_records(data)
    for name, live in after.items():
        if not name.startswith("orders-eu-"):
            assert live == before[name], name

    retention_ms = 7 * DAY_MS
    for p in range(SMALL["partitions"]):
        log = Log.open(data / f"orders-eu-{p}", read_only=True)
        try:
            assert log.log_start_offset > 0, "retention deleted nothing"
            assert all(s.size == 0 or now_ms - s.largest_timestamp <= retention_ms for s in log.segments)
        finally:
            log.close()
        assert len(after[f"orders-eu-{p}"]) < len(before[f"orders-eu-{p}"])
