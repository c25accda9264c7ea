"""The operator's own Prometheus metrics, and the small HTTP server for them and the probes.

Metric names start with ``kafka_cleaner_operator_`` (the sidecars' own are
``kafka_cleaner_*``). They live in a registry of their own, created once per process, so the
operator can be started more than once in one process (tests) without duplicate registrations.
Labels are bounded: namespace and policy, plus pod only on scrape failures (a policy's brokers),
and topic, partition and broker on the replication race gauge (at most
``divergence.MAX_RACE_RISKS`` per policy, removed once a replica is no longer at risk).

The server answers ``/metrics``, ``/healthz`` (the process is alive) and ``/readyz`` (kopf runs
and, with the webhook enabled, the webhook can answer: main.is_ready).
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = [
    "BROKERS_EXPECTED",
    "BROKERS_REPORTING",
    "DIVERGING_PARTITIONS",
    "LEADER",
    "RECONCILE_DURATION",
    "RECONCILE_ERRORS",
    "RECONCILIATIONS",
    "REGISTRY",
    "REPLICATION_RACE_SECONDS_LEFT",
    "ROLLOUT_PENDING_PODS",
    "ROLLOUT_STALLED",
    "SCRAPE_FAILURES",
    "SIDECAR_FAILING_PODS",
    "STALE_BROKERS",
    "WEBHOOK_FAILURES",
    "WEBHOOK_INJECTIONS",
    "HttpServer",
    "forget_policy",
    "set_race_risks",
    "start_http_server",
]

REGISTRY = CollectorRegistry(auto_describe=True)
_P = "kafka_cleaner_operator_"

RECONCILIATIONS = Counter(_P + "reconciliations", "Reconciliations of a CompactionPolicy (handlers and "
                          "reporting rounds).", ["namespace", "policy"], registry=REGISTRY)
RECONCILE_ERRORS = Counter(_P + "reconcile_errors", "Reconciliations that failed (API errors, invalid "
                           "specs, missing targets).", ["namespace", "policy", "reason"], registry=REGISTRY)
RECONCILE_DURATION = Histogram(_P + "reconcile_duration_seconds", "Duration of one reconciliation, the "
                               "sidecar scrapes included.", registry=REGISTRY,
                               buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
SCRAPE_FAILURES = Counter(_P + "sidecar_scrape_failures", "GET /status of a sidecar that failed (no answer, "
                          "an HTTP error, an invalid document).", ["namespace", "policy", "pod"], registry=REGISTRY)
BROKERS_EXPECTED = Gauge(_P + "brokers_expected", "Broker pods of a policy: those its workload should have "
                         "(spec.replicas, a StrimziPodSet's spec.pods) and any other target pod found.",
                         ["namespace", "policy"], registry=REGISTRY)
BROKERS_REPORTING = Gauge(_P + "brokers_reporting", "Target pods whose sidecar report is not stale.",
                          ["namespace", "policy"], registry=REGISTRY)
STALE_BROKERS = Gauge(_P + "stale_brokers", "Target pods whose sidecar has not reported for 3 intervals.",
                      ["namespace", "policy"], registry=REGISTRY)
DIVERGING_PARTITIONS = Gauge(_P + "diverging_partitions", "Partitions whose replicas diverge beyond what their "
                             "dirty sections explain (status.divergingPartitions).", ["namespace", "policy"],
                             registry=REGISTRY)
REPLICATION_RACE_SECONDS_LEFT = Gauge(
    _P + "replication_race_seconds_left", "Seconds until another replica's cleaner may remove a tombstone or "
    "transaction marker that this replica, out of the ISR or offline, has not replicated (negative: it may "
    "already be gone). Only replicas at risk have a series.", ["namespace", "policy", "topic", "partition", "broker"],
    registry=REGISTRY)
_race_series: dict[tuple[str, str], set[tuple[str, str, str]]] = {}
WEBHOOK_FAILURES = Counter(_P + "webhook_failures", "Pod admissions the webhook failed open on (admitted unchanged).",
                           registry=REGISTRY)
WEBHOOK_INJECTIONS = Counter(_P + "webhook_injections", "Pods the admission webhook injected the sidecar into.",
                             ["namespace", "policy"], registry=REGISTRY)
ROLLOUT_STALLED = Gauge(_P + "rollout_stalled", "1 while the policy's rollout is Stalled (a restarted pod did not "
                        "come back within rollout.progressDeadlineSeconds, or its sidecar was rolled back).",
                        ["namespace", "policy"], registry=REGISTRY)
ROLLOUT_PENDING_PODS = Gauge(_P + "rollout_pending_pods", "Target pods that do not run the wanted sidecar yet "
                             "(status.rollout.pendingPods).", ["namespace", "policy"], registry=REGISTRY)
SIDECAR_FAILING_PODS = Gauge(_P + "sidecar_failing_pods", "Target pods that are not Ready because their "
                             "kafka-cleaner container fails (waiting: CrashLoopBackOff, ...) after it ran before: "
                             "never rolled back or deleted by the operator; a person decides (Degraded, reason "
                             "SidecarFailing).", ["namespace", "policy"], registry=REGISTRY)
LEADER = Gauge(_P + "leader", "1 while this replica is the elected leader (or leader election is off).",
               registry=REGISTRY)


def forget_policy(namespace: str, policy: str) -> None:
    """Drop a deleted policy's gauges (counters stay until the process restarts, as usual)."""
    for gauge in (BROKERS_EXPECTED, BROKERS_REPORTING, STALE_BROKERS, DIVERGING_PARTITIONS, ROLLOUT_STALLED,
                  ROLLOUT_PENDING_PODS, SIDECAR_FAILING_PODS):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, policy)
    set_race_risks(namespace, policy, {})


def set_race_risks(namespace: str, policy: str, seconds_left: Mapping[tuple[str, int, int], float]) -> None:
    """The policy's replication race gauge: one series per (topic, partition, broker) at risk
    (``status.race_risks``), the series of replicas no longer at risk removed."""
    wanted = {(topic, str(partition), str(broker)): left for (topic, partition, broker), left in seconds_left.items()}
    for labels in _race_series.pop((namespace, policy), set()) - set(wanted):
        with contextlib.suppress(KeyError):
            REPLICATION_RACE_SECONDS_LEFT.remove(namespace, policy, *labels)
    for labels, left in wanted.items():
        REPLICATION_RACE_SECONDS_LEFT.labels(namespace, policy, *labels).set(left)
    if wanted:
        _race_series[(namespace, policy)] = set(wanted)


class HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    ready: Callable[[], bool]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: HttpServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            ready = self.server.ready()
            self._send(200 if ready else 503, b"ok\n" if ready else b"not ready\n")
        else:
            self._send(404, b"not found\n")

    def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # probes every few seconds would flood the log


def start_http_server(addr: str, port: int, ready: Callable[[], bool]) -> HttpServer:
    """Serve /metrics, /healthz and /readyz from a daemon thread (port 0: a free port;
    ``server.server_address`` tells which). ``server.shutdown()`` stops it."""
    server = HttpServer((addr, port), _Handler)
    server.ready = ready
    threading.Thread(target=server.serve_forever, name="operator-http", daemon=True).start()
    return server
