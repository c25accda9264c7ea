"""The kafka-cleaner sidecar as Kubernetes objects, and the patches that add or remove it.

Pure functions over plain dicts (no API calls): the handlers read the StatefulSet or the pod,
call these, and send what they return. Everything the operator puts into a broker pod is
built here, so "inject" and "remove" are exact inverses and can be tested without a server.

What the operator adds to a broker pod, and nothing else (DESIGN.md: it never changes the
broker's own containers):

* the sidecar container ``kafka-cleaner``, as a native sidecar (an ``initContainers`` entry
  with ``restartPolicy: Always`` and a startupProbe on ``/startupz``: the kubelet starts the
  broker once the sidecar's start-up gate is open) where the API server and every node's
  kubelet are >= 1.29 (:meth:`KubeVersion.of_cluster`), else as a regular container run with
  ``--no-gate`` (nothing orders it before the broker);
* the volume ``kafka-cleaner-policy``, the policy ConfigMap ``<policy>-kafka-cleaner``
  (key ``policy.yaml``), mounted by the sidecar at ``/etc/kafka-cleaner`` (a directory mount,
  not ``subPath``, so that the kubelet's atomic updates reach the sidecar, which reloads it);
* the annotations ``kafkacleaner.io/sidecar-hash`` (a hash of the two objects above and the
  pull secrets, so the pod template is touched only when the sidecar itself changes; policy
  edits go through the ConfigMap) and ``kafkacleaner.io/policy`` (which policy injected it);
* the policy's ``sidecar.imagePullSecrets`` the pod does not have yet, appended to its
  ``imagePullSecrets``; on a StatefulSet's template the annotation
  ``kafkacleaner.io/image-pull-secrets`` names those it added, the only ones it removes.

The sidecar mounts the broker's existing data volume (``target.dataVolume``) at
``target.mountPath``, and a JBOD broker's other ones (``target.additionalDataVolumes``) at
theirs, read-only in mode observe; it takes every log dir under each. Whoever may edit a policy
chooses those names and the image, so both are limited (:func:`data_volume_refusals`,
:func:`image_refusal`): only volumes of a kind a broker keeps its log dirs on, and only image
repositories the operator's installer allowed.

The sidecar runs as the broker (compact and stage modes write files the broker must open
read-write, and the sidecar refuses those modes otherwise): unless ``sidecar.securityContext``
sets them, its ``runAsUser``/``runAsGroup`` are the broker container's (the container that
mounts the data volume; its own securityContext, else the pod's), copied from the pod or
template being injected (:meth:`Sidecar.container_for`). No uid is ever hard-coded: a value
the pod already carries is one its admission (OpenShift's restricted-v2 SCC included)
accepted, and without one the sidecar gets none either, so the SCC assigns the same to both.
The pod's ``fsGroup`` applies to every container, the sidecar's too. Its command line is the contract with
``kafka-cleaner sidecar`` (docs/operator.md, "The sidecar's command line").
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cleaner.config import (
    DEFAULT_SIDECAR_MEMORY,
    RESERVED_MOUNT_PATHS,
    SIDECAR_POLICY_DIR,
    SIDECAR_POLICY_VOLUME,
    SIDECAR_TOKEN_DIR,
    LabelSelector,
    Mode,
    Policy,
)

__all__ = [
    "CONFIGMAP_KEY",
    "DATA_VOLUME_SOURCES",
    "DEFAULT_RESOURCES",
    "NATIVE_SIDECARS_SINCE",
    "POLICY_ANNOTATION",
    "POLICY_DIR",
    "POLICY_PATH",
    "POLICY_VOLUME",
    "PORT_NAME",
    "PULL_SECRETS_ANNOTATION",
    "RESERVED_MOUNT_PATHS",
    "RESTRICTED_SECURITY_CONTEXT",
    "SIDECAR_CONTAINER",
    "SIDECAR_HASH_ANNOTATION",
    "STARTUP_MARGIN_SECONDS",
    "STARTUP_PERIOD_SECONDS",
    "KubeVersion",
    "Sidecar",
    "broker_identity",
    "build_sidecar",
    "configmap_name",
    "data_volume_refusals",
    "find_sidecar",
    "gate_bound_seconds",
    "grace_period_warning",
    "has_data_volume",
    "image_refusal",
    "image_repository",
    "inject_into_pod",
    "label_selector_string",
    "missing_data_volumes",
    "patched",
    "pod_from_template",
    "policy_refusals",
    "removal_patch",
    "resources",
    "security_context",
    "selector_matches",
    "sidecar_args",
    "startup_budget_seconds",
    "template_patch",
    "template_policy",
]

SIDECAR_CONTAINER = "kafka-cleaner"
# The policy model (cleaner/config.py) reserves these names and paths: the CRD refuses a data
# volume of that name or mounted at, under or above one of those paths (the pod would be
# refused, or fail to start).
POLICY_VOLUME = SIDECAR_POLICY_VOLUME
POLICY_DIR = SIDECAR_POLICY_DIR
SERVICE_ACCOUNT_TOKEN_DIR = SIDECAR_TOKEN_DIR
CONFIGMAP_KEY = "policy.yaml"
POLICY_PATH = f"{POLICY_DIR}/{CONFIGMAP_KEY}"
#: A container port name is an IANA_SVC_NAME: at most 15 characters.
PORT_NAME = "cleaner-metrics"
SIDECAR_HASH_ANNOTATION = "kafkacleaner.io/sidecar-hash"
POLICY_ANNOTATION = "kafkacleaner.io/policy"
#: The pull secrets the operator added to a pod template (comma-separated): the ones it removes.
PULL_SECRETS_ANNOTATION = "kafkacleaner.io/image-pull-secrets"
#: SidecarContainers is beta and on by default from Kubernetes 1.29 (alpha, off, in 1.28).
NATIVE_SIDECARS_SINCE = (1, 29)
#: The native sidecar's startupProbe on ``/startupz``: how often the kubelet asks...
STARTUP_PERIOD_SECONDS = 5
#: ...and how long it waits beyond twice the gate's bound before it restarts the sidecar
#: (the interpreter's start, the policy's first read; see :func:`startup_budget_seconds`).
STARTUP_MARGIN_SECONDS = 120

#: The Pod Security "restricted" profile for the sidecar; ``sidecar.securityContext`` is merged
#: over it (nested objects merge key by key, lists replace).
RESTRICTED_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}

#: The sidecar's resources when the policy sets none: requests equal to limits for both CPU and
#: memory, so that a broker pod whose own containers are Guaranteed stays Guaranteed (a pod is
#: Guaranteed only if every container, init and sidecar containers included, has requests =
#: limits for both). 512Mi holds the default 128 MiB offset map (cleaner.dedupeBufferSize) of
#: one cleaner thread and the engine's buffers (a clean peaked at ~250 MB RSS, README
#: "Performance"); a policy whose limit cannot hold its offset map is refused
#: (``cleaner.config.sidecar_memory_needed``).
DEFAULT_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "250m", "memory": DEFAULT_SIDECAR_MEMORY},
    "limits": {"cpu": "250m", "memory": DEFAULT_SIDECAR_MEMORY},
}

_CONFIGMAP_SUFFIX = "-kafka-cleaner"
_MAX_NAME = 253


# --------------------------------------------------------------------------------------------
# The cluster's version
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class KubeVersion:
    """A Kubernetes version, as far as the operator cares (major, minor): the API server's
    (``from_version_info``), or the oldest of the API server and every node's kubelet
    (``of_cluster``), which is what decides native sidecars."""

    major: int
    minor: int
    #: What this version is (``the API server``, ``the kubelet of node x``), for the log.
    source: str = dataclasses.field(default="", compare=False)

    @classmethod
    def from_version_info(cls, info: Mapping[str, Any]) -> KubeVersion:
        """From ``GET /version``. Managed clusters report ``minor: "29+"`` (EKS, GKE) and
        ``gitVersion: v1.29.3-eks-adc7111``: the leading digits of ``major``/``minor`` count,
        and ``gitVersion`` is the fallback when those are missing or empty."""
        major, minor = _leading_int(info.get("major")), _leading_int(info.get("minor"))
        if major is not None and minor is not None:
            return cls(major, minor, "the API server")
        match = re.match(r"v?(\d+)\.(\d+)", str(info.get("gitVersion") or ""))
        if match is None:
            raise ValueError(f"cannot tell the Kubernetes version from {dict(info)!r}")
        return cls(int(match.group(1)), int(match.group(2)), "the API server")

    @classmethod
    def of_cluster(cls, info: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]] | None,
                   why_no_nodes: str = "") -> KubeVersion:
        """The oldest of the API server (``GET /version``) and the kubelet of every node
        (``status.nodeInfo.kubeletVersion``, e.g. ``v1.29.3-eks-5e0fdde``): a native sidecar
        needs both. The API server drops ``restartPolicy`` of init containers it does not
        support, and a kubelet older than 1.29 (the version skew policy allows three minors
        below the API server) runs such an init container as a plain one, which never exits:
        the broker would never start. Any node counts, not only those the brokers run on
        today: a broker pod may be rescheduled anywhere. A kubelet version that cannot be read
        counts as too old, and so do nodes that cannot be listed (``nodes`` None, with
        ``why_no_nodes``): a regular container is always safe."""
        oldest = cls.from_version_info(info)
        if nodes is None:
            return cls(0, 0, f"the nodes' kubelets (they could not be listed: {why_no_nodes or 'unknown'})")
        for node in nodes:
            name = (node.get("metadata") or {}).get("name", "?")
            raw = str(((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion") or "")
            match = re.match(r"v?(\d+)\.(\d+)", raw)
            version = (cls(int(match.group(1)), int(match.group(2)), f"the kubelet of node {name} ({raw})")
                       if match else cls(0, 0, f"the kubelet of node {name} (version {raw!r} unreadable)"))
            oldest = min(oldest, version)
        return oldest

    @property
    def native_sidecars(self) -> bool:
        """Whether init containers with ``restartPolicy: Always`` run as sidecars."""
        return (self.major, self.minor) >= NATIVE_SIDECARS_SINCE

    def __str__(self) -> str:
        number = f"{self.major}.{self.minor}" if (self.major, self.minor) != (0, 0) else "unknown"
        return f"{number} ({self.source})" if self.source else number


def _leading_int(value: object) -> int | None:
    match = re.match(r"\d+", str(value or ""))
    return int(match.group(0)) if match else None


# --------------------------------------------------------------------------------------------
# Names and selectors
# --------------------------------------------------------------------------------------------


def configmap_name(policy_name: str) -> str:
    """``<policy>-kafka-cleaner``; names too long for that keep a hash of the full name."""
    name = policy_name + _CONFIGMAP_SUFFIX
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(policy_name.encode()).hexdigest()[:10]
    head = policy_name[: _MAX_NAME - len(_CONFIGMAP_SUFFIX) - len(digest) - 1].rstrip("-.")
    return f"{head}-{digest}{_CONFIGMAP_SUFFIX}"


def label_selector_string(selector: Mapping[str, Any] | LabelSelector) -> str:
    """A ``metav1.LabelSelector`` (dict, or the policy model's) as a ``labelSelector`` query."""
    if isinstance(selector, LabelSelector):
        selector = selector.to_dict()
    parts = [f"{key}={value}" for key, value in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], sorted(expr.get("values") or [])
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise ValueError(f"unknown label selector operator {op!r}")
    return ",".join(parts)


def selector_matches(selector: Mapping[str, Any] | LabelSelector, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy a label selector (the webhook decides without the API server)."""
    if isinstance(selector, LabelSelector):
        selector = selector.to_dict()
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(op)
        if not ok:
            return False
    return True


# --------------------------------------------------------------------------------------------
# The sidecar
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sidecar:
    """What a policy puts into a broker pod: the container, the ConfigMap volume, and the hash
    that tells whether a pod (template) already has exactly this."""

    policy_name: str
    container: dict[str, Any]
    volume: dict[str, Any]
    native: bool
    hash: str
    #: ``sidecar.imagePullSecrets``: Secret names the pod must list in its ``imagePullSecrets``.
    pull_secrets: tuple[str, ...] = ()
    #: The broker's data volume: the container mounting it is the broker's.
    data_volume: str = ""
    #: ``runAsUser``/``runAsGroup`` the policy leaves to the broker (``container_for``).
    inherited: tuple[str, ...] = ()

    def container_for(self, pod_spec: Mapping[str, Any]) -> dict[str, Any]:
        """The container for this pod (template): ``container`` with the broker's
        ``runAsUser``/``runAsGroup`` where the policy sets none (see the module docstring).
        Root (0) is never copied: the sidecar's restricted defaults run as non-root."""
        identity = broker_identity(pod_spec, self.data_volume)
        extra = {key: identity[key] for key in self.inherited if identity.get(key)}
        if not extra:
            return copy.deepcopy(self.container)
        out = copy.deepcopy(self.container)
        out["securityContext"] = {**out.get("securityContext", {}), **extra}
        return out

    @property
    def list_name(self) -> str:
        """Where the container goes: ``initContainers`` (native sidecar) or ``containers``."""
        return "initContainers" if self.native else "containers"

    @property
    def other_list_name(self) -> str:
        return "containers" if self.native else "initContainers"

    @property
    def port(self) -> int:
        return int(self.container["ports"][0]["containerPort"])

    @property
    def annotations(self) -> dict[str, str]:
        return {SIDECAR_HASH_ANNOTATION: self.hash, POLICY_ANNOTATION: self.policy_name}


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


#: What the sidecar takes over from the broker container (``Sidecar.container_for``).
INHERITED_IDENTITY = ("runAsUser", "runAsGroup")


def broker_identity(pod_spec: Mapping[str, Any], data_volume: str) -> dict[str, int]:
    """``runAsUser``/``runAsGroup`` the broker runs with, as far as the pod (template) says:
    the broker container's securityContext (the first regular container mounting
    ``data_volume``), else the pod's. Empty when neither sets them (the image's USER, or what
    an SCC assigns)."""
    pod_level = pod_spec.get("securityContext") or {}
    broker = next((c for c in pod_spec.get("containers") or []
                   if c.get("name") != SIDECAR_CONTAINER
                   and any(m.get("name") == data_volume for m in c.get("volumeMounts") or [])), None)
    own = (broker or {}).get("securityContext") or {}
    out = {}
    for key in INHERITED_IDENTITY:
        value = own.get(key, pod_level.get(key))
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out


def security_context(policy: Policy) -> dict[str, Any]:
    """The restricted defaults with the policy's ``sidecar.securityContext`` merged over them."""
    extra = policy.sidecar.security_context
    return _deep_merge(RESTRICTED_SECURITY_CONTEXT, extra.to_dict() if extra is not None else {})


def resources(policy: Policy) -> dict[str, Any]:
    """The sidecar's resources: :data:`DEFAULT_RESOURCES` when ``sidecar.resources`` is unset,
    else exactly what the policy says, never merged with the defaults (a request merged with a
    default limit below it would make a pod the API server refuses). What Kubernetes then does:

    * only ``limits``: the API server sets each missing request to its limit, so requests =
      limits and a Guaranteed broker pod stays Guaranteed;
    * only ``requests`` (or limits for one resource only): the sidecar has no limit on the rest
      and the broker pod becomes Burstable (evicted before Guaranteed pods under node pressure;
      the CPU manager's static policy no longer pins its CPUs);
    * ``resources: {}``: none at all; the pod is Burstable if its other containers set any.
    """
    if policy.sidecar.resources is None:
        return copy.deepcopy(DEFAULT_RESOURCES)
    return policy.sidecar.resources.to_dict()


def sidecar_args(policy: Policy, *, gate: bool = True) -> list[str]:
    """The ``kafka-cleaner`` arguments: the contract with the sidecar (docs/operator.md).

    Log dirs are ``mountPath/logDir``, normalised (``.`` is the mount itself), under every data
    volume's mount (JBOD: ``additionalDataVolumes``); wildcards such as ``kafka-log*`` are passed
    as they are, and the sidecar expands them. ``gate`` False (a regular container, which
    nothing starts before the broker): ``--no-gate``, the sidecar's start-up gate opens at
    once, and it takes no ``.lock`` at start (the broker, starting beside it, would exit on it).
    """
    target = policy.target
    if target is None:
        raise ValueError("a policy without a target has no sidecar")
    args = ["sidecar", "--policy", POLICY_PATH]
    for _volume, mount_path in target.data_volumes:
        for log_dir in target.log_dirs:
            args += ["--log-dir", posixpath.normpath(posixpath.join(mount_path, log_dir))]
    args += ["--listen", f"0.0.0.0:{policy.sidecar.port}", "--broker-name", "$(POD_NAME)"]
    if not gate:
        args.append("--no-gate")
    return args


def gate_bound_seconds(policy: Policy) -> int:
    """The longest the sidecar's start-up gate holds the broker back, by its own clock: none
    in observe mode (the gate opens at once), else the larger of ``compact.maxGateSeconds`` and
    ``stage.maxCommitSeconds``. Both, whichever the mode: compact and stage mount the same
    volumes, so a switch between them reaches the pods through the ConfigMap alone, without a
    new pod template (and so without a new startupProbe)."""
    if policy.mode is Mode.OBSERVE:
        return 0
    return max(policy.compact.max_gate_seconds, policy.stage.max_commit_seconds)


def startup_budget_seconds(policy: Policy) -> int:
    """``failureThreshold`` x ``periodSeconds`` of the native sidecar's startupProbe: twice
    the gate's bound plus :data:`STARTUP_MARGIN_SECONDS`. The gate's deadline is checked
    between partitions (a stage set or a compact clean begun before it finishes or aborts
    after it), and the policy and metadata reads before the lock are not under it; a budget
    the gate could overrun would make the kubelet restart the sidecar mid-gate, and the new
    one would run the gate again, forever, with the broker waiting. With this budget the
    sidecar's own bound opens the gate first, and the kubelet starts the broker."""
    return 2 * gate_bound_seconds(policy) + STARTUP_MARGIN_SECONDS


def grace_period_warning(policy: Policy, pod_spec: Mapping[str, Any]) -> str | None:
    """Why the pod's ``terminationGracePeriodSeconds`` (default 30) is too short for the
    sidecar's termination commit (stage mode), or None. The grace period covers the broker's
    shutdown and then the commit (a native sidecar is stopped after the broker has exited),
    which is bounded by ``stage.maxCommitSeconds`` but may overrun it by the set in progress
    (:func:`startup_budget_seconds`): below twice that, the kubelet's SIGKILL cuts the commit.
    Nothing is lost (a commit is crash-safe, and the next start-up gate commits what is left),
    but the space is reclaimed a restart later, or never for a broker rolled often."""
    if policy.mode is not Mode.STAGE or policy.stage.max_commit_seconds == 0:
        return None
    grace = pod_spec.get("terminationGracePeriodSeconds")
    grace = 30 if grace is None else int(grace)
    needed = 2 * policy.stage.max_commit_seconds
    if grace >= needed:
        return None
    return (f"terminationGracePeriodSeconds is {grace}, below twice stage.maxCommitSeconds ({needed} s): the "
            "termination commit of stage mode may be cut short (staged sets then wait for the next start-up "
            f"gate); give the broker pods at least {needed} s plus the broker's own shutdown time, or lower "
            "stage.maxCommitSeconds")


def _probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT_NAME, "scheme": "HTTP"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "successThreshold": 1,
        "failureThreshold": failures,
    }


def build_sidecar(policy: Policy, *, image: str, native: bool) -> Sidecar:
    """The sidecar of ``policy`` (which must have a name and a target)."""
    target = policy.target
    if target is None or policy.name is None:
        raise ValueError("only a named policy with a target has a sidecar")
    container: dict[str, Any] = {
        "name": SIDECAR_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["kafka-cleaner"],
        "args": sidecar_args(policy, gate=native),
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE",
             "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
        ],
        "ports": [{"name": PORT_NAME, "containerPort": policy.sidecar.port, "protocol": "TCP"}],
        "volumeMounts": [
            {"name": POLICY_VOLUME, "mountPath": POLICY_DIR, "readOnly": True},
            *({"name": volume, "mountPath": mount_path, "readOnly": policy.mode is Mode.OBSERVE}
              for volume, mount_path in target.data_volumes),
            # The sidecar calls no Kubernetes API, so it gets no credentials: the API server's
            # ServiceAccount admission mounts the pod's token into every container that has
            # nothing at this path (the broker's token, on a StatefulSet's pods), and skips a
            # container that has. The policy volume stands there, read-only.
            {"name": POLICY_VOLUME, "mountPath": SERVICE_ACCOUNT_TOKEN_DIR, "readOnly": True},
        ],
        # No readiness probe (a native sidecar also gets the gate's startupProbe, below). A
        # container's readiness (a native sidecar's too) counts towards the
        # *pod's* Ready condition: a readiness probe on /readyz (200 once the policy is loaded
        # and the first scan is done, which takes minutes on a large broker) would keep the
        # broker out of its Service endpoints and stall the StatefulSet's rolling update, and
        # a sidecar that cannot read its policy would take a healthy broker out of service.
        # Whether the sidecars run the current policy and have scanned is the policy's own
        # Ready condition (from /status), never the broker's.
        "livenessProbe": _probe("/healthz", period=10, failures=6),
        "securityContext": security_context(policy),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    wanted = resources(policy)
    if wanted:
        container["resources"] = wanted
    if native:
        # The start-up gate (README): the kubelet starts the broker container once this
        # probe succeeds, i.e. once /startupz says the gate is open; liveness starts then too.
        budget = startup_budget_seconds(policy)
        container["startupProbe"] = _probe("/startupz", period=STARTUP_PERIOD_SECONDS,
                                           failures=-(-budget // STARTUP_PERIOD_SECONDS))
        container["restartPolicy"] = "Always"
    # optional: a pod created after the policy (and so its ConfigMap) was deleted, or before
    # the operator wrote it, still starts; the sidecar waits for a policy file meanwhile.
    volume = {
        "name": POLICY_VOLUME,
        "configMap": {"name": configmap_name(policy.name), "optional": True,
                      "items": [{"key": CONFIGMAP_KEY, "path": CONFIGMAP_KEY}]},
    }
    pull_secrets = policy.sidecar.image_pull_secrets
    hashed: dict[str, Any] = {"container": container, "volume": volume}
    if pull_secrets:  # absent when empty: the hash of every policy without them stays as it was
        hashed["imagePullSecrets"] = list(pull_secrets)
    canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    own = policy.sidecar.security_context.to_dict() if policy.sidecar.security_context is not None else {}
    inherited = tuple(key for key in INHERITED_IDENTITY if key not in own)
    return Sidecar(policy.name, container, volume, native, digest, pull_secrets, target.data_volume, inherited)


# --------------------------------------------------------------------------------------------
# Reading pods and templates
# --------------------------------------------------------------------------------------------


def _named(items: Sequence[Mapping[str, Any]] | None, name: str) -> Mapping[str, Any] | None:
    return next((item for item in items or () if item.get("name") == name), None)


def find_sidecar(pod_spec: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """``(list name, container)`` of the ``kafka-cleaner`` container in a pod (template) spec."""
    for list_name in ("initContainers", "containers"):
        container = _named(pod_spec.get(list_name), SIDECAR_CONTAINER)
        if container is not None:
            return list_name, container
    return None


def template_policy(template: Mapping[str, Any]) -> str | None:
    """The CompactionPolicy whose sidecar a pod template carries (its annotation), if any."""
    return ((template.get("metadata") or {}).get("annotations") or {}).get(POLICY_ANNOTATION)


def has_data_volume(pod_spec: Mapping[str, Any], volume: str,
                    claim_templates: Sequence[Mapping[str, Any]] = ()) -> bool:
    """Whether the pod (template) has the volume, or the StatefulSet a claim template of that name."""
    if _named(pod_spec.get("volumes"), volume) is not None:
        return True
    return any((t.get("metadata") or {}).get("name") == volume for t in claim_templates)


def missing_data_volumes(policy: Policy, pod_spec: Mapping[str, Any],
                         claim_templates: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """The policy's data volumes (``dataVolume`` and a JBOD broker's ``additionalDataVolumes``)
    the pod (template) lacks: the sidecar must see every log dir of the broker, not some."""
    assert policy.target is not None
    return [volume for volume, _ in policy.target.data_volumes
            if not has_data_volume(pod_spec, volume, claim_templates)]


#: Pod volume sources a broker keeps its log dirs on: the only ones a policy may name as data
#: volumes (besides the StatefulSet's volumeClaimTemplates). Everything else a pod may carry
#: (secret, configMap, projected service-account tokens, hostPath, downwardAPI, csi, nfs, ...)
#: would hand a policy author what the broker pod can read, or the node's files.
DATA_VOLUME_SOURCES = ("persistentVolumeClaim", "ephemeral", "emptyDir")


def data_volume_refusals(policy: Policy, pod_spec: Mapping[str, Any],
                         claim_templates: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """Why the policy may not mount each of its data volumes that the pod (template) has but
    that is no data volume: a policy author (the aggregated ``edit`` role) would otherwise
    mount the broker pod's Secrets, ConfigMaps, projected service-account token or a hostPath
    into a container running an image of their choice. A claim template of that name wins over
    a pod volume (the StatefulSet controller does the same). Volumes the pod lacks are
    :func:`missing_data_volumes`' to report."""
    assert policy.target is not None
    fields = ["target.dataVolume", *(f"target.additionalDataVolumes[{i}].name"
                                     for i in range(len(policy.target.additional_data_volumes)))]
    claims = {(t.get("metadata") or {}).get("name") for t in claim_templates}
    refusals = []
    for field, (volume, _) in zip(fields, policy.target.data_volumes, strict=True):
        found = _named(pod_spec.get("volumes"), volume)
        if volume in claims or found is None:
            continue
        kind = next((key for key in found if key != "name"), "empty")
        if kind not in DATA_VOLUME_SOURCES:
            refusals.append(f"{field} {volume!r} is a {kind} volume: a policy may mount only the broker's data "
                            f"volumes ({', '.join(DATA_VOLUME_SOURCES)} or a volumeClaimTemplate), never a "
                            "Secret, ConfigMap, projected token or hostPath")
    return refusals


def image_repository(image: str) -> str:
    """``registry/name:tag@sha256:...`` -> ``registry/name``: what an allow-list entry names."""
    name = image.split("@", 1)[0]
    colon = name.rfind(":")
    return name[:colon] if colon > name.rfind("/") else name


def image_refusal(image: str, allowed: Sequence[str]) -> str | None:
    """Why the sidecar may not run ``image`` (None: it may): its repository must be one of
    ``allowed`` (any tag or digest of it). A policy author chooses ``spec.sidecar.image``, and
    the sidecar mounts the broker's data: the installer decides which programs may."""
    if image_repository(image) in allowed:
        return None
    listed = ", ".join(allowed) if allowed else "empty: set KAFKA_CLEANER_SIDECAR_IMAGE or the allow-list"
    return (f"spec.sidecar.image {image!r} is not allowed: its repository must be one of the operator's allowed "
            f"sidecar images ({listed}; Helm value sidecar.allowedImages, KAFKA_CLEANER_ALLOWED_SIDECAR_IMAGES)")


def policy_refusals(policy: Policy, image: str, pod_spec: Mapping[str, Any],
                    claim_templates: Sequence[Mapping[str, Any]], allowed_images: Sequence[str]) -> list[str]:
    """Everything the policy chose that its author may not: the image, then the data volumes.
    The webhook (before it injects into a pod) and the operator (before it patches a pod
    template) both ask, so neither path can be used to get round the other."""
    refusal = image_refusal(image, allowed_images)
    return [*([refusal] if refusal else []), *data_volume_refusals(policy, pod_spec, claim_templates)]


# --------------------------------------------------------------------------------------------
# Patches of a StatefulSet's pod template (JSON patches)
# --------------------------------------------------------------------------------------------


def template_patch(template: Mapping[str, Any], sidecar: Sidecar,
                   resource_version: str | None = None) -> list[dict[str, Any]] | None:
    """The JSON patch (RFC 6902) of a StatefulSet that makes its pod template carry exactly
    ``sidecar``, or None when it already does (same hash, container and volume present).

    A JSON patch, not a strategic merge patch: an existing sidecar must be *replaced whole*
    (fields dropped from the spec must not linger), and the strategic merge patch has no way
    to replace one entry of a list merged by name: ``$patch: replace`` inside an entry
    replaces the whole list (every init container, every volume of the broker), which the
    API server then refuses, or worse, accepts. Each operation on an existing entry is
    preceded by a ``test`` of that entry's name, and the whole patch by a ``test`` of
    ``resource_version`` (the patch fails with 422 if the StatefulSet changed since it was
    read). Only the sidecar's own entries and annotations are named.
    """
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    annotations = meta.get("annotations") or {}
    current = find_sidecar(spec)
    volume = _named(spec.get("volumes"), POLICY_VOLUME)
    secrets = _secret_names(spec)
    container = sidecar.container_for(spec)
    if (annotations.get(SIDECAR_HASH_ANNOTATION) == sidecar.hash
            and annotations.get(POLICY_ANNOTATION) == sidecar.policy_name
            and current is not None and current[0] == sidecar.list_name and volume is not None
            and all(name in secrets for name in sidecar.pull_secrets)
            # the broker's uid changed since: the sidecar follows it
            and current[1].get("securityContext") == container.get("securityContext")):
        return None
    ops: list[dict[str, Any]] = []
    if resource_version is not None:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
    base = "/spec/template/spec"
    lists = {name: list(spec.get(name) or []) for name in ("initContainers", "containers", "volumes")}
    if current is not None and current[0] == sidecar.other_list_name:  # moved (native sidecars or not)
        ops += _remove_entry(base, current[0], lists[current[0]], SIDECAR_CONTAINER)
        current = None
    ops += _put_entry(base, sidecar.list_name, lists[sidecar.list_name], SIDECAR_CONTAINER, container)
    ops += _put_entry(base, "volumes", lists["volumes"], POLICY_VOLUME, sidecar.volume)
    ours = _added_secrets(annotations)
    kept = [name for name in secrets if name not in ours or name in sidecar.pull_secrets]
    added = [name for name in sidecar.pull_secrets if name not in kept]
    ops += _secrets_ops(spec, [*kept, *added])
    wanted = dict(sidecar.annotations)
    owned = [name for name in sidecar.pull_secrets if name in added or name in ours]
    if owned:
        wanted[PULL_SECRETS_ANNOTATION] = ",".join(owned)
    if "annotations" not in meta:
        ops.append({"op": "add", "path": "/spec/template/metadata/annotations", "value": wanted})
    else:
        ops += [{"op": "add", "path": f"/spec/template/metadata/annotations/{_pointer(key)}", "value": value}
                for key, value in wanted.items()]
        if not owned and PULL_SECRETS_ANNOTATION in annotations:
            ops.append({"op": "remove", "path": f"/spec/template/metadata/annotations/"
                                                f"{_pointer(PULL_SECRETS_ANNOTATION)}"})
    return ops


def _secret_names(spec: Mapping[str, Any]) -> list[str]:
    return [ref.get("name") for ref in spec.get("imagePullSecrets") or []]


def _added_secrets(annotations: Mapping[str, str]) -> set[str]:
    """The pull secrets the operator added, from :data:`PULL_SECRETS_ANNOTATION`."""
    return {name for name in (annotations.get(PULL_SECRETS_ANNOTATION) or "").split(",") if name}


def _secrets_ops(spec: Mapping[str, Any], names: Sequence[str]) -> list[dict[str, Any]]:
    """The ops that make ``imagePullSecrets`` the list of ``names`` (entries the operator did not
    add keep their place and content), or none when it already is. The whole list is tested and
    replaced: it is short, and the patch already tests the StatefulSet's resourceVersion."""
    current = list(spec.get("imagePullSecrets") or [])
    if [ref.get("name") for ref in current] == list(names):
        return []
    path = "/spec/template/spec/imagePullSecrets"
    by_name = {ref.get("name"): ref for ref in current}
    value = [dict(by_name.get(name) or {"name": name}) for name in names]
    if not value:
        return [{"op": "test", "path": path, "value": current}, {"op": "remove", "path": path}]
    if "imagePullSecrets" not in spec:
        return [{"op": "add", "path": path, "value": value}]
    return [{"op": "test", "path": path, "value": current}, {"op": "replace", "path": path, "value": value}]


def _pointer(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901: ``~`` and ``/`` escaped)."""
    return token.replace("~", "~0").replace("/", "~1")


def _put_entry(base: str, list_name: str, items: list[Mapping[str, Any]], name: str,
               value: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Replace the entry ``name`` of ``list_name`` whole, or append it (creating the list)."""
    index = next((i for i, item in enumerate(items) if item.get("name") == name), None)
    if index is None:
        if not items:
            return [{"op": "add", "path": f"{base}/{list_name}", "value": [dict(value)]}]
        return [{"op": "add", "path": f"{base}/{list_name}/-", "value": dict(value)}]
    path = f"{base}/{list_name}/{index}"
    test = {"op": "test", "path": f"{path}/name", "value": name}
    return [test, {"op": "replace", "path": path, "value": dict(value)}]


def _remove_entry(base: str, list_name: str, items: list[Mapping[str, Any]], name: str) -> list[dict[str, Any]]:
    """Remove the entry ``name`` of ``list_name``; the whole list when it was the only entry
    (so an emptied list disappears, as it was absent before the injection)."""
    index = next(i for i, item in enumerate(items) if item.get("name") == name)
    path = f"{base}/{list_name}/{index}"
    test = {"op": "test", "path": f"{path}/name", "value": name}
    if len(items) == 1:
        return [test, {"op": "remove", "path": f"{base}/{list_name}"}]
    return [test, {"op": "remove", "path": path}]


def removal_patch(template: Mapping[str, Any], resource_version: str | None = None) -> list[dict[str, Any]] | None:
    """The JSON patch that removes exactly what :func:`template_patch` added (the sidecar from
    either list, the policy volume, the pull secrets it added, its annotations), or None if none
    is there. A list or the annotations left empty go whole, as they were absent before."""
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    base = "/spec/template/spec"
    ops: list[dict[str, Any]] = []
    for list_name, name in (("initContainers", SIDECAR_CONTAINER), ("containers", SIDECAR_CONTAINER),
                            ("volumes", POLICY_VOLUME)):
        items = list(spec.get(list_name) or [])
        if _named(items, name) is not None:
            ops += _remove_entry(base, list_name, items, name)
    annotations = meta.get("annotations") or {}
    added = _added_secrets(annotations)
    ops += _secrets_ops(spec, [name for name in _secret_names(spec) if name not in added])
    ours = [key for key in (SIDECAR_HASH_ANNOTATION, POLICY_ANNOTATION, PULL_SECRETS_ANNOTATION)
            if key in annotations]
    if set(annotations) and set(annotations) <= set(ours):
        ops.append({"op": "remove", "path": "/spec/template/metadata/annotations"})
    else:
        ops += [{"op": "remove", "path": f"/spec/template/metadata/annotations/{_pointer(key)}"} for key in ours]
    if not ops:
        return None
    if resource_version is not None:
        ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
    return ops


def patched(document: Mapping[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A copy of ``document`` with a JSON patch of :func:`template_patch` or :func:`removal_patch`
    applied (the ops they use: test, add, replace, remove), as the API server would apply it.
    The operator sends the patch, never this result; it builds the pod of the admission dry
    run from it. A failing ``test`` raises ValueError, as the server answers 422."""
    out = copy.deepcopy(dict(document))
    for op in ops:
        *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in op["path"].split("/")[1:]]
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = last if not isinstance(node, list) else (len(node) if last == "-" else int(last))
        if op["op"] == "test":
            if node[key] != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif op["op"] == "add" and isinstance(node, list):
            node.insert(key, copy.deepcopy(op["value"]))
        elif op["op"] in ("add", "replace"):
            node[key] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del node[key]
        else:
            raise ValueError(f"unsupported JSON patch op {op['op']!r}")
    return out


def pod_from_template(stateful_set: Mapping[str, Any], template: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The pod the StatefulSet controller would create from ``template`` (default: the
    StatefulSet's own), for a server-side dry-run create: the template's metadata and spec, a
    ``generateName`` (a dry run of an existing name would fail on the name alone) and, as the
    controller adds them, a ``persistentVolumeClaim`` volume for each claim template (the claims
    need not exist for the API server to admit the pod)."""
    meta = stateful_set["metadata"]
    sts_spec = stateful_set.get("spec") or {}
    template = template if template is not None else sts_spec.get("template") or {}
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    volumes = list(spec.get("volumes") or [])
    for claim in sts_spec.get("volumeClaimTemplates") or []:
        name = (claim.get("metadata") or {}).get("name")
        if name and _named(volumes, name) is None:
            volumes.append({"name": name, "persistentVolumeClaim": {"claimName": f"{name}-{meta['name']}-0"}})
    if volumes:
        spec["volumes"] = volumes
    pod_meta = {key: copy.deepcopy(value) for key, value in (template.get("metadata") or {}).items()
                if key in ("labels", "annotations")}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**pod_meta, "generateName": f"{meta['name']}-", "namespace": meta.get("namespace")},
            "spec": spec}


# --------------------------------------------------------------------------------------------
# Pods at admission (the webhook)
# --------------------------------------------------------------------------------------------


def inject_into_pod(pod: Mapping[str, Any], sidecar: Sidecar) -> dict[str, Any]:
    """A copy of ``pod`` carrying the sidecar, its volume and annotations (what the webhook's
    JSON patch turns the pod into). A pod that has a ``kafka-cleaner`` container already (a
    StatefulSet's, say) is returned unchanged."""
    out = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    if find_sidecar(spec) is not None:
        return out
    spec.setdefault(sidecar.list_name, []).append(sidecar.container_for(spec))
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != POLICY_VOLUME]
    spec["volumes"] = [*volumes, copy.deepcopy(sidecar.volume)]
    secrets = _secret_names(spec)
    if missing := [name for name in sidecar.pull_secrets if name not in secrets]:
        spec["imagePullSecrets"] = [*(spec.get("imagePullSecrets") or []), *({"name": n} for n in missing)]
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **sidecar.annotations}
    return out
