"""Broker pods whose kubelet is the test: for tests that need a policy's pods to answer with a
real ``kafka-cleaner sidecar`` over given log dirs (generated, or a live real broker's).

The pods are bound to a node of the test's own that no kwok plays (kwok gives every pod on its
nodes 127.0.0.1, and the API server's pod proxy refuses loopback), so the test writes their
status as a kubelet would (Running, at the address it chooses). Each pod declares the port of
its own sidecar process, which runs on this machine, listening on every address.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml
from compaction_operator.injection import PORT_NAME, SIDECAR_CONTAINER
from control_plane import ControlPlane
from operator_helpers import policy, wait_for
from ports import free_port

KAFKA_CLEANER = pathlib.Path(sys.executable).with_name("kafka-cleaner")
LABELS = {"app": "test-broker"}


class BrokerSidecar:
    """A broker pod's sidecar: ``kafka-cleaner sidecar`` over the broker's log dirs."""

    def __init__(self, name: str, log_dirs: Sequence[pathlib.Path], policy_file: pathlib.Path, log: pathlib.Path,
                 now_ms: int | None = None) -> None:
        self.name, self.log_dirs, self.port = name, list(log_dirs), free_port()
        self.log = log.open("w")
        args = [str(KAFKA_CLEANER), "sidecar", "--policy", str(policy_file), "--listen", f"0.0.0.0:{self.port}",
                "--broker-name", name, "--no-gate"]
        args += [a for d in self.log_dirs for a in ("--log-dir", str(d))]
        args += ["--now-ms", str(now_ms)] if now_ms is not None else []
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: self._ready(), timeout=60, what=f"{name}'s sidecar /readyz")

    @property
    def log_dir(self) -> pathlib.Path:
        return self.log_dirs[0]

    def _ready(self) -> bool:
        assert self.process.poll() is None, f"{self.name}'s sidecar exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as r:
                return r.status == 200
        except OSError:  # not listening yet, or not ready (HTTP 503)
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.log.close()


def _pod(sidecar: BrokerSidecar, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": sidecar.name, "labels": LABELS},
            "spec": {"nodeName": node, "containers": [
                {"name": "kafka", "image": "apache/kafka:4.1.0"},
                {"name": SIDECAR_CONTAINER, "image": "registry.example/kafka-cleaner:e2e",
                 "ports": [{"name": PORT_NAME, "containerPort": sidecar.port}]}]}}  # fmt: skip


def run_pods_at(plane: ControlPlane, namespace: str, sidecars: Sequence[BrokerSidecar], address: str) -> None:
    """What the kubelet would write: the pods Running at ``address``."""
    for b in sidecars:
        status = {"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}
        plane.kubectl("patch", "pod", b.name, "-n", namespace, "--subresource=status", "--type=merge",
                      "-p", json.dumps(status))


@contextlib.contextmanager
def broker_pods(plane: ControlPlane, root: pathlib.Path, namespace: str, dirs: Mapping[str, Sequence[pathlib.Path]],
                *, sidecar_policy: str, policy_spec: Mapping[str, Any] | None = None,
                now_ms: int | None = None) -> Iterator[list[BrokerSidecar]]:
    """A sidecar and a pod per broker (name -> its log dirs) in ``namespace``, and the
    CompactionPolicy ``orders`` selecting them by label (``policy_spec``: more of its spec)."""
    node = f"{namespace}-node"
    policy_file = root / "policy.yaml"
    policy_file.write_text(sidecar_policy)
    plane.kubectl("create", "namespace", namespace, check=False)
    (root / "node.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}))
    plane.kubectl("apply", "-f", str(root / "node.yaml"))
    running: list[BrokerSidecar] = []
    try:
        for name, log_dirs in dirs.items():
            running.append(BrokerSidecar(name, log_dirs, policy_file, root / f"{name}.log", now_ms))
        for b in running:
            (root / f"{b.name}.yaml").write_text(yaml.safe_dump(_pod(b, node)))
            plane.kubectl("apply", "-n", namespace, "-f", str(root / f"{b.name}.yaml"))
        target = {"podSelector": {"matchLabels": LABELS}, "dataVolume": "data", "mountPath": "/var/lib/kafka",
                  "logDirs": ["kafka-log*"], "injection": "webhook"}
        (root / "policy-cr.yaml").write_text(yaml.safe_dump(policy("orders", target=target, **(policy_spec or {}))))
        plane.kubectl("apply", "-n", namespace, "-f", str(root / "policy-cr.yaml"))
        yield running
    finally:
        for b in running:
            b.stop()
        # No kubelet confirms these pods' deletion: deleted at once, or their namespace stays.
        plane.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", check=False)
        plane.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=60s", check=False)
        plane.kubectl("delete", "node", node, "--ignore-not-found", check=False)
