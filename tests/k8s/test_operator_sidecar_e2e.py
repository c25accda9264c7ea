"""The operator with the real sidecar: the real kopf (KopfRunner), the real kubernetes client,
fakekube, and a real ``kafka-cleaner sidecar`` process on loopback over a generated broker log
dir, standing in for the broker pod's injected container.

fakekube runs no kubelet, so the test plays it, as literally as it can:

* the sidecar process is started from the container the operator injected into the StatefulSet
  (its ``command`` and ``args``, ``$(POD_NAME)`` expanded from its ``env``), with the pod's
  mount paths mapped to directories of the test and ``--listen 0.0.0.0:PORT`` narrowed to
  loopback (the pod's network here);
* the policy volume is laid out like a kubelet's ConfigMap volume (``policy.yaml`` a symlink
  into ``..data``, a symlink swapped atomically to a new directory on every update), filled
  from the ConfigMap the operator wrote, and synced when the test says the kubelet would;
* the broker pod is the StatefulSet controller's pod (from the template), with
  ``status.podIP: 127.0.0.1``, where the operator pulls ``GET /status`` from.

Then issue 5's steps: the status gains the broker entry, dirty ratios, top partitions and
``Ready=True`` at the current generation; a spec change reaches the ConfigMap and the sidecar
(``policyGeneration``); a killed sidecar makes the policy Degraded and a restarted one Ready;
pause and resume; deleting the policy removes the sidecar and the ConfigMap. Every API call the
operator made is then checked against the Helm chart's RBAC rules.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from compaction_operator import metrics
from compaction_operator.injection import SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION, find_sidecar
from fakekube import RunningFakeKube
from operator_helpers import (
    NS,
    Cluster,
    G,
    P,
    V,
    broker_statefulset,
    canonical,
    free_port,
    pod_of,
    policy,
    running_operator,
    wait_for,
)

from cleaner.generate import GeneratorConfig, generate

KAFKA_CLEANER = pathlib.Path(sys.executable).with_name("kafka-cleaner")
POLICY = "live"
CONFIGMAP = f"{POLICY}-kafka-cleaner"
#: Generous: a loaded 2-core CI machine runs this next to other tests.
TIMEOUT = 30.0


# -------------------------------------------------------------------------------------------
# The kubelet's part
# -------------------------------------------------------------------------------------------


class ConfigMapVolume:
    """A ConfigMap volume as the kubelet's atomic writer lays it out: each item is a symlink
    ``<path> -> ..data/<path>``, ``..data`` a symlink to a timestamped directory, and an update
    writes a new directory and renames a new ``..data`` over the old one (so the file the
    sidecar reads changes all at once, and its inode and mtime say nothing)."""

    def __init__(self, root: pathlib.Path, volume: Mapping[str, Any]) -> None:
        self.root = root
        self.source = volume["configMap"]
        self.version = 0
        self.data: dict[str, str] | None = None
        root.mkdir(parents=True)

    def sync(self, configmap: Mapping[str, Any]) -> bool:
        """Project ``configmap`` (the items of the volume) if it changed; whether it did."""
        assert configmap["metadata"]["name"] == self.source["name"]
        items = self.source.get("items") or [{"key": k, "path": k} for k in configmap.get("data") or {}]
        data = {item["path"]: configmap["data"][item["key"]] for item in items}
        if data == self.data:
            return False
        self.version += 1
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y_%m_%d_%H_%M_%S")
        new = self.root / f"..{stamp}.{self.version:04d}"
        new.mkdir()
        for path, text in data.items():
            (new / path).write_text(text)
        link = self.root / "..data"
        old = os.readlink(link) if link.is_symlink() else None
        (self.root / "..data_tmp").symlink_to(new.name)
        os.replace(self.root / "..data_tmp", link)
        for path in data:
            if not (self.root / path).is_symlink():
                (self.root / path).symlink_to(f"..data/{path}")
        if old is not None:
            for file in (self.root / old).iterdir():
                file.unlink()
            (self.root / old).rmdir()
        self.data = data
        return True


def _expand(value: str, env: Mapping[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion of ``command``/``args`` (``$$`` escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


class SidecarProcess:
    """The injected container of ``pod``, run as the kubelet would run it, with the pod's
    volumes at ``volumes`` (volume name -> directory of the test)."""

    def __init__(self, pod: Mapping[str, Any], volumes: Mapping[str, pathlib.Path], log: pathlib.Path) -> None:
        found = find_sidecar(pod["spec"])
        assert found is not None, "the pod has no kafka-cleaner container"
        container = found[1]
        assert container["command"] == ["kafka-cleaner"]  # on the image's PATH
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": NS}
        env = {e["name"]: e.get("value") or fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
               for e in container.get("env") or []}
        mounts = sorted(((m["mountPath"], volumes[m["name"]]) for m in container["volumeMounts"]),
                        key=lambda m: -len(m[0]))

        def host_path(arg: str) -> str:
            for mount_path, directory in mounts:
                if arg == mount_path or arg.startswith(mount_path + "/"):
                    return str(directory) + arg[len(mount_path):]
            return arg

        args = [host_path(_expand(arg, env)) for arg in container["args"]]
        listen = args.index("--listen") + 1
        host, _, port = args[listen].rpartition(":")
        assert host == "0.0.0.0"
        args[listen] = f"127.0.0.1:{port}"  # the pod network of this test
        self.port = int(port)
        self.argv = [str(KAFKA_CLEANER), *args]
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONSAFEPATH": "1", **env}
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: self._alive() and self.get("/healthz") == 200, timeout=TIMEOUT, interval=0.1,
                 what=f"the sidecar's /healthz on port {self.port}")

    def _alive(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the sidecar exited with {self.process.returncode}:\n{self.log.read_text()}")
        return True

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=5) as response:
            return dict(json.loads(response.read()))

    def kill(self) -> None:
        """SIGKILL: the container dies, nothing answers on its port."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(TIMEOUT)

    def stop(self) -> int:
        """SIGTERM, as the kubelet stops a container; the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(TIMEOUT)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(TIMEOUT)


# -------------------------------------------------------------------------------------------
# The test
# -------------------------------------------------------------------------------------------


def files_of(root: pathlib.Path) -> dict[str, tuple[int, str]]:
    """Every file under ``root``: size and SHA-256 (the data a read-only mount protects)."""
    return {str(f.relative_to(root)): (f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest())
            for f in sorted(root.rglob("*")) if f.is_file()}


def reconciliations() -> float:
    return metrics.REGISTRY.get_sample_value("kafka_cleaner_operator_reconciliations_total",
                                             {"namespace": NS, "policy": POLICY}) or 0.0


def test_the_real_sidecar_reports_through_the_operator(cluster: Cluster, fakekube: RunningFakeKube,
                                                       tmp_path: pathlib.Path,
                                                       assert_rbac_allows: Callable[..., None]) -> None:
    data_volume = tmp_path / "volumes" / "data"  # the broker's PVC, mounted at /var/lib/kafka
    generate(data_volume / "kafka-log0", GeneratorConfig(topics=2, partitions=2, records=2000, keys=200,
                                                         segment_bytes=64 * 1024, compression="none"))
    data_before = files_of(data_volume)
    cluster.apps.create_namespaced_stateful_set(NS, broker_statefulset())
    original = cluster.sts()
    port = free_port()

    def ready_at(generation: int) -> dict[str, Any] | None:
        """The status, once Ready=True was written for ``generation``."""
        status = cluster.status(POLICY)
        ready = cluster.condition(POLICY, "Ready")
        ok = (ready.get("status") == "True" and ready.get("observedGeneration") == generation
              and status.get("observedGeneration") == generation)
        return status if ok else None

    sidecar: SidecarProcess | None = None
    try:
        with running_operator():
            cluster.custom.create_namespaced_custom_object(G, V, NS, P, policy(
                POLICY, target={"statefulSet": "broker", "dataVolume": "data", "mountPath": "/var/lib/kafka",
                                "logDirs": ["kafka-log*"]},  # a glob, as for Strimzi's kafka-log<id>
                sidecar={"port": port}, topics=[{"match": "topic-.*", "cleanupPolicy": "compact"}],
                reporting={"intervalSeconds": 1}))

            # -- the StatefulSet controller and the kubelet: a pod from the injected template ----
            sts = wait_for(lambda: (s := cluster.sts()) and SIDECAR_HASH_ANNOTATION in
                           s["spec"]["template"]["metadata"].get("annotations", {}) and s,
                           timeout=TIMEOUT, what="the sidecar injected")
            template = sts["spec"]["template"]
            assert canonical(template["spec"]["containers"]) == canonical(original["spec"]["template"]["spec"]
                                                                         ["containers"])
            container = template["spec"]["initContainers"][-1]
            assert container["name"] == SIDECAR_CONTAINER
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert "readinessProbe" not in container  # never gates the broker pod
            pod = pod_of(sts, 0)
            cluster.core.create_namespaced_pod(NS, pod, _preload_content=False)
            cluster.core.patch_namespaced_pod_status("broker-0", NS, {"status": {
                "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})

            [volume] = [v for v in pod["spec"]["volumes"] if "configMap" in v and v["configMap"]["name"] == CONFIGMAP]
            policy_volume = ConfigMapVolume(tmp_path / "volumes" / volume["name"], volume)
            assert policy_volume.sync(wait_for(lambda: cluster.configmap(CONFIGMAP), timeout=TIMEOUT,
                                               what="the ConfigMap"))
            sidecar = SidecarProcess(pod, {volume["name"]: policy_volume.root, "data": data_volume},
                                     tmp_path / "sidecar.log")
            assert sidecar.port == port
            sidecar.start()

            # -- the broker entry, dirty ratios, top partitions, Ready at generation 1 ---------
            status = wait_for(lambda: ready_at(1), timeout=TIMEOUT, what="Ready at generation 1")
            own = sidecar.status()
            assert own["broker"] == "broker-0" and own["policyGeneration"] == 1
            assert [d["path"] for d in own["logDirs"]] == [str(data_volume / "kafka-log0")]
            broker = status["brokers"]["broker-0"]
            assert broker["policyGeneration"] == 1 and broker["mode"] == "observe"
            assert broker["state"] == "observing" and broker["missedReports"] == 0
            assert broker["partitions"] == 4 and broker["uncleanablePartitions"] == 0
            assert 0 < broker["maxDirtyRatio"] <= 1 and broker["cleanableBytes"] > 0
            assert broker["scannedAt"] and broker["reportedAt"] and "message" not in broker
            assert status["summary"]["brokers"] == "1/1"
            assert status["summary"]["maxDirtyRatio"] == broker["maxDirtyRatio"]
            top = status["topPartitions"]
            assert {(p["topic"], p["partition"]) for p in top} == {(f"topic-{t}", p) for t in (0, 1) for p in (0, 1)}
            assert {(p["topic"], p["partition"], p["cleanableRatio"]) for p in top} == {
                (p["topic"], p["partition"], p["cleanableRatio"]) for p in own["partitions"]}
            assert all(p["broker"] == "broker-0" and p["logDir"] == str(data_volume / "kafka-log0") for p in top)
            assert [p["cleanableRatio"] for p in top] == sorted((p["cleanableRatio"] for p in top), reverse=True)
            ready = cluster.condition(POLICY, "Ready")
            assert ready["reason"] == "AllBrokersReporting" and ready["message"].startswith("1/1 brokers reporting")
            assert sorted(c["type"] for c in status["conditions"]) == ["Degraded", "Ready", "Reconciling", "Stalled"]
            assert all(c["status"] == "False" for c in status["conditions"] if c["type"] != "Ready")

            # -- a spec change: the ConfigMap, then (once the kubelet syncs) the sidecar -------
            sts_version = cluster.sts()["metadata"]["resourceVersion"]
            generation = cluster.patch_spec(POLICY, {"topics": [{"match": "topic-0", "cleanupPolicy": "compact"}]})
            assert generation == 2
            configmap = wait_for(lambda: (c := cluster.configmap(CONFIGMAP))
                                 and "generation: 2" in c["data"]["policy.yaml"] and c,
                                 timeout=TIMEOUT, what="the ConfigMap at generation 2")
            assert configmap["metadata"]["annotations"]["kafkacleaner.io/policy-generation"] == "2"
            # Until the kubelet syncs the volume the sidecar runs generation 1, and the policy says so.
            awaiting = wait_for(lambda: (c := cluster.condition(POLICY, "Reconciling")).get("reason")
                                == "AwaitingPolicy" and c, timeout=TIMEOUT, what="AwaitingPolicy")
            assert awaiting["status"] == "True" and "broker-0" in awaiting["message"]
            assert cluster.condition(POLICY, "Ready")["status"] == "False"
            assert policy_volume.sync(configmap)
            wait_for(lambda: sidecar.status()["policyGeneration"] == 2, timeout=TIMEOUT, interval=0.2,
                     what="the sidecar's /status at policyGeneration 2")
            status = wait_for(lambda: ready_at(2), timeout=TIMEOUT, what="Ready at generation 2")
            assert status["brokers"]["broker-0"]["policyGeneration"] == 2
            # The reloaded policy compacts topic-0 only (the next scan says so).
            status = wait_for(lambda: (s := cluster.status(POLICY)) and {p["topic"] for p in s["topPartitions"]}
                              == {"topic-0"} and s, timeout=TIMEOUT, what="top partitions of topic-0 only")
            assert cluster.sts()["metadata"]["resourceVersion"] == sts_version  # no rollout for a policy edit

            # -- the sidecar dies: Degraded, the pod named; restarted: Ready again --------------
            sidecar.kill()
            degraded = wait_for(lambda: (c := cluster.condition(POLICY, "Degraded")).get("status") == "True" and c,
                                timeout=TIMEOUT, what="Degraded")
            assert degraded["reason"] == "BrokersNotReporting" and "broker-0" in degraded["message"]
            assert degraded["observedGeneration"] == 2
            status = cluster.status(POLICY)
            assert status["brokers"]["broker-0"]["state"] == "unreachable"
            assert status["brokers"]["broker-0"]["missedReports"] >= 3
            assert status["summary"]["brokers"] == "0/1"
            assert cluster.condition(POLICY, "Ready")["status"] == "False"
            sidecar.start()
            wait_for(lambda: ready_at(2), timeout=TIMEOUT, what="Ready after the restart")
            assert cluster.condition(POLICY, "Degraded")["status"] == "False"
            assert cluster.status(POLICY)["brokers"]["broker-0"]["missedReports"] == 0

            # -- pause: nothing reaches the cluster; reports go on -------------------------------
            generation = cluster.patch_spec(POLICY, {"paused": True})
            wait_for(lambda: cluster.status(POLICY).get("paused") is True, timeout=TIMEOUT, what="paused")
            reconciling = cluster.condition(POLICY, "Reconciling")
            assert (reconciling["status"], reconciling["reason"]) == ("False", "Paused")
            frozen_cm = cluster.configmap(CONFIGMAP)["metadata"]["resourceVersion"]
            frozen_sts = cluster.sts()["metadata"]["resourceVersion"]
            paused_generation = cluster.patch_spec(POLICY, {"topics": [{"match": "topic-.*",
                                                                        "cleanupPolicy": "compact"}]})
            assert paused_generation == generation + 1
            wait_for(lambda: cluster.status(POLICY).get("observedGeneration") == paused_generation,
                     timeout=TIMEOUT, what="the paused generation observed")
            rounds = reconciliations()
            wait_for(lambda: reconciliations() >= rounds + 2, timeout=TIMEOUT, what="two reporting rounds")
            assert cluster.configmap(CONFIGMAP)["metadata"]["resourceVersion"] == frozen_cm
            assert cluster.sts()["metadata"]["resourceVersion"] == frozen_sts
            ready = wait_for(lambda: (c := cluster.condition(POLICY, "Ready")).get("status") == "True" and c,
                             timeout=TIMEOUT, what="Ready while paused")
            assert ready["message"].endswith("(paused)") and ready["observedGeneration"] == paused_generation
            assert sidecar.status()["policyGeneration"] == 2  # still the last published policy

            # -- resume: the pending spec is published and reaches the sidecar ---------------------
            generation = cluster.patch_spec(POLICY, {"paused": False})
            configmap = wait_for(lambda: (c := cluster.configmap(CONFIGMAP))
                                 and f"generation: {generation}" in c["data"]["policy.yaml"] and c,
                                 timeout=TIMEOUT, what=f"the ConfigMap at generation {generation}")
            assert policy_volume.sync(configmap)
            wait_for(lambda: sidecar.status()["policyGeneration"] == generation, timeout=TIMEOUT, interval=0.2,
                     what=f"the sidecar at generation {generation}")
            status = wait_for(lambda: (s := ready_at(generation)) and s["paused"] is False
                              and len(s["topPartitions"]) == 4 and s,
                              timeout=TIMEOUT, what=f"Ready at generation {generation}, all topics again")
            reconciling = cluster.condition(POLICY, "Reconciling")
            assert (reconciling["status"], reconciling["reason"]) == ("False", "Reconciled")

            # -- delete: the sidecar leaves the template, the ConfigMap goes ----------------------
            cluster.custom.delete_namespaced_custom_object(G, V, NS, P, POLICY)
            wait_for(lambda: cluster.policy(POLICY) is None, timeout=TIMEOUT, what="the policy deleted")
            assert canonical(cluster.sts()["spec"]["template"]) == canonical(original["spec"]["template"])
            assert cluster.configmap(CONFIGMAP) is None
            # The StatefulSet controller would now replace the pod: its sidecar gets SIGTERM.
            assert sidecar.stop() == 0
    finally:
        if sidecar is not None:
            sidecar.close()

    assert files_of(data_volume) == data_before  # observe mode: the log dir untouched
    log = (tmp_path / "sidecar.log").read_text()
    assert "Traceback" not in log, log
    events = {e[:2] for e in cluster.events()}
    assert {("CompactionPolicy", "SidecarInjected"), ("CompactionPolicy", "PolicyPublished"),
            ("CompactionPolicy", "BrokersNotReporting"), ("CompactionPolicy", "DegradedCleared"),
            ("CompactionPolicy", "SidecarRemoved")} <= events
    assert_rbac_allows(fakekube)
