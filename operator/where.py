"""``kafka-cleaner-operator where``: every record of one key still on the disks of a policy's
brokers, and when each will be gone: one command for every replica of the cluster.

``kafka-cleaner where`` answers for the log dirs of one machine; a key's records are on every
replica. This command finds the policy's broker pods as the operator does (its target's
StatefulSet or pod selector) and asks each pod's sidecar (``GET /where``, the same code as the
CLI) at once, then prints the answers together with a column naming the broker. The proof
of a deletion is only as good as the brokers that answered: a broker that did not (no
sidecar, not running, a timeout) is named, and the exit code says the answer is incomplete.

Two ways to reach the sidecars (``--via``):

- ``direct``: ``http://<pod IP>:<sidecar port>/where``, as the operator scrapes ``/status``;
  from inside the cluster, e.g. ``kubectl exec deploy/kafka-cleaner-operator --
  kafka-cleaner-operator where ...`` (the operator's ServiceAccount reads what it needs);
- ``proxy``: the API server's pod proxy (``pods/proxy``), from anywhere a kubeconfig reaches
  the API server; who may ask is then who may ``get pods/proxy`` in the brokers' namespace,
  and the API server's audit log records every question.

``auto`` (the default) is ``direct`` inside a pod, ``proxy`` elsewhere.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import click
import kubernetes
from compaction_operator.handlers import broker_pod
from compaction_operator.injection import label_selector_string
from compaction_operator.kube import Kube
from compaction_operator.status import BrokerPod
from kubernetes.client.exceptions import ApiException

from cleaner.config import parse_policy
from cleaner.errors import KafkaCleanerError
from cleaner.output import output_option, resolve_format
from cleaner.where import Sighting, key_from, print_sightings, question_options, summary

__all__ = ["where_command"]

EXIT_FOUND, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3
CONCURRENCY = 16
"""Brokers asked at once: each reads one partition of its own disk."""
MAX_ANSWER = 64 << 20
"""The largest answer read from one broker: about 200,000 records of one key."""


@dataclass
class Answer:
    """One broker's answer, or why there is none."""

    broker: str
    sightings: list[Sighting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def policy_brokers(kube: Kube, namespace: str, name: str) -> tuple[list[BrokerPod], int]:
    """The policy's broker pods (running or starting, not being deleted) and its sidecar port
    (for a pod whose sidecar declares none)."""
    # A listing, not a get: the operator's ServiceAccount may list and watch policies only.
    found = [p for p in kube.list_policies([namespace]) if p["metadata"]["name"] == name]
    if not found:
        raise click.UsageError(f"no CompactionPolicy {name} in namespace {namespace}")
    manifest = {k: found[0][k] for k in ("apiVersion", "kind", "metadata", "spec") if k in found[0]}
    try:
        policy = parse_policy(manifest, source=f"CompactionPolicy {namespace}/{name}")
    except KafkaCleanerError as e:
        raise click.UsageError(str(e)) from None
    target = policy.target
    if target is None:
        raise click.UsageError(f"CompactionPolicy {namespace}/{name} has no spec.target: it selects no broker")
    if target.pod_selector is not None:
        selector = label_selector_string(target.pod_selector)
    else:
        assert target.stateful_set is not None
        sts = kube.read_statefulset(namespace, target.stateful_set)
        if sts is None:
            raise click.UsageError(f"StatefulSet {target.stateful_set} (the target of CompactionPolicy "
                                   f"{namespace}/{name}) not found")
        selector = label_selector_string((sts.get("spec") or {}).get("selector") or {})
    pods = [pod for pod in kube.list_pods(namespace, selector)
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not (pod.get("metadata") or {}).get("deletionTimestamp")]
    return sorted((broker_pod(pod) for pod in pods), key=lambda b: b.name), policy.sidecar.port


def _message(e: ApiException) -> str:
    """The Status message of an API error (what a person can act on), else its body."""
    try:
        return str(json.loads(e.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(e.body)[:300]


def _answer(broker: str, status: int, body: bytes) -> Answer:
    """A sidecar's answer (its status and body), or what was wrong with it."""
    if len(body) > MAX_ANSWER:
        return Answer(broker, error=f"an answer of more than {MAX_ANSWER >> 20} MiB (a hot key): ask that broker "
                                    "with kafka-cleaner where")
    if status == 404:
        return Answer(broker, error="HTTP 404: its sidecar has no /where (older than this command)")
    try:
        document = json.loads(body)
        if status != 200:
            return Answer(broker, error=f"HTTP {status}: {document['error']}")
        return Answer(broker, [Sighting(**s) for s in document["sightings"]], [str(n) for n in document["notes"]])
    except (ValueError, TypeError, KeyError):
        return Answer(broker, error=f"HTTP {status}, not a where answer: {body[:200]!r}")


def ask_direct(pod: BrokerPod, port: int, query: str, timeout: float) -> Answer:
    """``GET /where`` of the pod's sidecar at the pod's address."""
    if not pod.ip:
        return Answer(pod.name, error="the pod has no IP address yet")
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    url = f"http://{host}:{pod.port or port}/where?{query}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return _answer(pod.name, response.status, response.read(MAX_ANSWER + 1))
    except urllib.error.HTTPError as e:
        return _answer(pod.name, e.code, e.read(MAX_ANSWER + 1))
    except OSError as e:
        return Answer(pod.name, error=f"GET {url}: {e}")


def ask_through_proxy(kube: Kube, namespace: str, pod: BrokerPod, port: int, query: str, timeout: float) -> Answer:
    """``GET /where`` of the pod's sidecar through the API server's pod proxy."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod.name}:{pod.port or port}/proxy/where"
    client = kube.client
    try:
        method, url, headers, _, _ = client.param_serialize("GET", path, query_params=urllib.parse.parse_qsl(query),
                                                             auth_settings=["BearerToken"])
        response = client.call_api(method, url, header_params=headers, _request_timeout=timeout)
        body = response.response.read(MAX_ANSWER + 1)  # urllib3's, not preloaded: bounded
    except OSError as e:
        return Answer(pod.name, error=f"the API server's proxy: {e}")
    if response.status != 200 and not (body.startswith(b"{") and b'"error"' in body):
        try:  # the API server's own refusal (a Status), not the sidecar's answer passed on
            message = json.loads(body)["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:300]
        return Answer(pod.name, error=f"the API server's proxy: HTTP {response.status}: {message}")
    return _answer(pod.name, response.status, body)


def ask_every_broker(kube: Kube, namespace: str, brokers: Sequence[BrokerPod], port: int, query: str, *,
                     via: str, timeout: float) -> list[Answer]:
    """Every broker's answer (concurrently), in the brokers' order."""
    def ask(pod: BrokerPod) -> Answer:
        if not pod.has_sidecar:
            return Answer(pod.name, error="the pod runs no kafka-cleaner sidecar")
        if via == "direct":
            return ask_direct(pod, port, query, timeout)
        return ask_through_proxy(kube, namespace, pod, port, query, timeout)

    with concurrent.futures.ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        return list(pool.map(ask, brokers))


@click.command("where")
@click.option("--namespace", "-n", required=True, help="The namespace of the CompactionPolicy and its brokers.")
@click.option("--policy", "policy_name", required=True, help="The CompactionPolicy whose brokers are asked.")
@question_options
@click.option("--via", type=click.Choice(["auto", "direct", "proxy"]), default="auto", show_default=True,
              help="How the sidecars are reached: their pod IPs (direct), the API server's pod proxy (proxy); "
              "auto: direct inside a pod, proxy elsewhere.")
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds a broker may take to answer (it reads one partition of its disk).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Outside a pod: the kubeconfig (default: $KUBECONFIG, ~/.kube/config).")
@output_option
def where_command(namespace: str, policy_name: str, topic: str, key: str | None, key_hex: str | None,
                  key_file: Any, partition: int | None, partitions: int | None, via: str, timeout: float,
                  kubeconfig: str | None, output: str | None, as_json: bool) -> None:
    """Every record of one key still on the disks of the policy's brokers (value or
    tombstone), each with its broker, file, offset, timestamp, and when it will be gone.
    Exit 0 when records were found and every broker answered, 1 when every broker answered
    and none holds a record of the key, 3 when a broker did not answer (the answer is
    incomplete: it proves nothing about that broker)."""
    key_bytes = key_from(key, key_hex, key_file)
    in_pod = "KUBERNETES_SERVICE_HOST" in os.environ
    if via == "auto":
        via = "direct" if in_pod else "proxy"
    if in_pod and kubeconfig is None:
        kubernetes.config.load_incluster_config()
    else:
        kubernetes.config.load_kube_config(config_file=kubeconfig or os.environ.get("KUBECONFIG"))
    query = urllib.parse.urlencode({"topic": topic, "key-hex": key_bytes.hex(),
                                    **({"partition": partition} if partition is not None else {}),
                                    **({"partitions": partitions} if partitions is not None else {})})
    kube = Kube(kubernetes.client.ApiClient())
    try:
        brokers, port = policy_brokers(kube, namespace, policy_name)
        if not brokers:
            raise click.UsageError(f"CompactionPolicy {namespace}/{policy_name} selects no running pod")
        click.echo(f"where: asking {len(brokers)} broker(s) of {namespace}/{policy_name} ({via})", err=True)
        answers = ask_every_broker(kube, namespace, brokers, port, query, via=via, timeout=timeout)
    except ApiException as e:
        raise click.ClickException(f"the API server: HTTP {e.status} {e.reason}: {_message(e)}") from None
    finally:
        kube.close()
    sightings = [(a.broker, s) for a in answers for s in a.sightings]
    fmt = resolve_format(output, as_json)
    if fmt == "json":
        click.echo(json.dumps({a.broker: {"sightings": [asdict(s) for s in a.sightings], "notes": a.notes,
                                          **({"error": a.error} if a.error else {})} for a in answers}, indent=2))
    elif sightings:
        print_sightings(fmt, [s for _, s in sightings], brokers=[b for b, _ in sightings])
    for a in answers:
        for note in a.notes:
            click.echo(f"where: {a.broker}: {note}", err=True)
        if a.error:
            click.echo(f"where: {a.broker}: no answer: {a.error}", err=True)
    unanswered = [a.broker for a in answers if a.error]
    answered = len(answers) - len(unanswered)
    if sightings:
        click.echo(f"where: {summary([s for _, s in sightings])} on {len({b for b, _ in sightings})} of "
                   f"{answered} broker(s) that answered", err=True)
    else:
        click.echo(f"where: no record of the key in {topic} on the {answered} broker(s) that answered", err=True)
    if unanswered:
        click.echo(f"where: incomplete: {len(unanswered)} broker(s) did not answer ({', '.join(unanswered)})",
                   err=True)
        sys.exit(EXIT_INCOMPLETE)
    sys.exit(EXIT_FOUND if sightings else EXIT_NOT_FOUND)
