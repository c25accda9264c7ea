"""A real Kubernetes control plane on loopback for the tests (issue 12).

etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from their Go modules
(``scripts/get-controlplane.sh``, Kubernetes 1.34.2), and kwok's controller, which plays the
kubelet of fake nodes: it marks the pods scheduled on them Running and Ready. Nothing here is
an emulation of the API server: admission (PodSecurity, the mutating webhook over TLS), RBAC,
CEL validation of CRDs, server-side apply and the StatefulSet and garbage-collector
controllers are Kubernetes' own code.

Access: a static token for an admin (``system:masters``); a test acts as the chart's
ServiceAccount with a token the API server issues (``kubectl create token``, see
conftest.install_chart), so every call the chart's RBAC lacks is refused. Serving
certificates come from ``trustme``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kubernetes
import trustme
import yaml
from ports import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".tools" / "k8s" / "current" / "bin"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
ADMIN_TOKEN = "kafka-cleaner-tests-admin"
FAKE_NODES = ("kwok-node-0", "kwok-node-1", "kwok-node-2")
#: The kubelet version kwok's nodes report (kwok keeps the one a node is created with; its own
#: default, kwok-vX.Y.Z, is no Kubernetes version): the release of the control plane, as on a
#: cluster whose nodes are upgraded with it. The operator reads it (native sidecars or not).
KUBELET_VERSION = "v1.34.2"
#: Where the tests install the chart (conftest.install_chart), and its ServiceAccount's name.
CHART_RELEASE, CHART_NAMESPACE = "kc", "cleaner-operator"
CHART_ACCOUNT = "kc-kafka-cleaner-operator"  # the release's full name: ServiceAccount, Lease, ...


def available() -> bool:
    return all((BIN / c).is_file() for c in COMPONENTS)


def missing_reason() -> str:
    return f"the control plane is not built in {BIN} (make setup runs scripts/get-controlplane.sh)"


@dataclass
class _Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


class ControlPlane:
    """Start with ``start()``, stop with ``stop()``; ``kubeconfig`` is for the admin."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.processes: list[_Process] = []
        self.ca = trustme.CA(organization_name="kafka-cleaner tests")
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = self.root / "kubeconfig"

    # -- files ----------------------------------------------------------------------------
    def _write_files(self) -> None:
        serving = self.ca.issue_cert("127.0.0.1", "localhost", "kubernetes", "kubernetes.default.svc")
        serving.cert_chain_pems[0].write_to_path(str(self.root / "apiserver.crt"))
        serving.private_key_pem.write_to_path(str(self.root / "apiserver.key"))
        self.ca.cert_pem.write_to_path(str(self.root / "ca.crt"))
        # The service-account signing key (any RSA key; trustme's leaf keys are RSA).
        signer = self.ca.issue_cert("service-accounts.kafka-cleaner.test")
        signer.private_key_pem.write_to_path(str(self.root / "sa.key"))
        (self.root / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n')
        self.kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_for(ADMIN_TOKEN)))

    def kubeconfig_for(self, token: str) -> dict:
        """A kubeconfig calling the API server with ``token`` (the admin's, or a ServiceAccount's)."""
        user: dict = {"token": token}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "tests", "cluster": {"server": self.url, "certificate-authority": str(self.root / "ca.crt")}}
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "tests", "context": {"cluster": "tests", "user": "user"}}],
            "current-context": "tests",
        }

    # -- processes -------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.root / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(BIN / name), *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes.append(_Process(name, proc, log))

    def _wait(self, what: str, ok, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.processes:
                if p.proc.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.tail()}")
            with contextlib.suppress(Exception):
                if ok():
                    return
            time.sleep(0.2)
        raise RuntimeError(
            f"{what} not ready within {timeout_s} s:\n" + "\n".join(p.tail(2000) for p in self.processes)
        )

    def _healthy(self, path: str) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.root / "ca.crt"))
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            return r.status == 200

    def start(self) -> ControlPlane:
        self._write_files()
        client, peer = free_port(), free_port()
        self._spawn(
            "etcd",
            [
                "--name=tests",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=tests=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        r = self.root
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--tls-cert-file={r / 'apiserver.crt'}",
                f"--tls-private-key-file={r / 'apiserver.key'}",
                f"--client-ca-file={r / 'ca.crt'}",
                f"--token-auth-file={r / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,PodSecurity,MutatingAdmissionWebhook,"
                "ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={r / 'sa.key'}",
                f"--service-account-signing-key-file={r / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver", lambda: self._healthy("/readyz"))
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                f"--service-account-private-key-file={r / 'sa.key'}",
                f"--root-ca-file={r / 'ca.crt'}",
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-route,-service",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._spawn(
            "kwok",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--config={BIN.parent / 'kwok-stages.yaml'}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=127.0.0.1",
                "--server-address=127.0.0.1:0",
            ],
        )
        self._create_nodes()
        return self

    def _create_nodes(self) -> None:
        nodes = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
                },
                "status": {
                    "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    "nodeInfo": {"kubeletVersion": KUBELET_VERSION},
                },
            }
            for name in FAKE_NODES
        ]
        path = self.root / "nodes.yaml"
        path.write_text(yaml.safe_dump_all(nodes))
        self.kubectl("apply", "-f", str(path))
        self._wait(
            "kwok's nodes",
            lambda: (
                self.kubectl("wait", "--for=condition=Ready", "nodes", "--all", "--timeout=2s", check=False).returncode
                == 0
            ),
        )

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True, timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """The real kubectl of the same release, as the admin unless ``kubeconfig`` says otherwise."""
        proc = subprocess.run(
            [str(BIN / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        return proc

    def stop(self) -> None:
        """Each component in the reverse order of its start, one after the other: a
        kube-apiserver stopped together with its etcd spends 20 s on shutdown hooks that reach
        for the gone etcd (1 s when etcd is still there)."""
        for p in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.proc.pid, signal.SIGTERM)
            try:
                p.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.proc.pid, signal.SIGKILL)
                p.proc.wait()
        self.processes.clear()


@contextlib.contextmanager
def activated_kubeconfig(path: Path) -> Iterator[None]:
    """Point every kubeconfig reader in this process at ``path``, and restore them afterwards.

    Setting ``$KUBECONFIG`` is not enough: the kubernetes client reads it once, at import, into
    ``KUBE_CONFIG_DEFAULT_LOCATION``, which kopf's login and a bare ``load_kube_config()`` use
    (K8S_TESTING.md §3, pitfall 2). The client's default Configuration is loaded too, so
    ``kubernetes.client.CoreV1Api()`` reaches the same server as the same user.
    """
    kube_config, client = kubernetes.config.kube_config, kubernetes.client
    saved = (os.environ.get("KUBECONFIG"), kube_config.KUBE_CONFIG_DEFAULT_LOCATION,
             client.Configuration.get_default_copy())  # fmt: skip
    os.environ["KUBECONFIG"] = str(path)
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)
    kubernetes.config.load_kube_config(config_file=str(path))
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved[0]
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved[1]
        client.Configuration.set_default(saved[2])


@contextlib.contextmanager
def running(root: Path) -> Iterator[ControlPlane]:
    plane = ControlPlane(root)
    try:
        yield plane.start()
    finally:
        plane.stop()
