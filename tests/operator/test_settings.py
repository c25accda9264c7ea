"""The operator's environment settings, the webhook's choice of policy, the kopf settings."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import kopf
import pytest
from compaction_operator.handlers import FINALIZER, build_settings
from compaction_operator.settings import ENV_VARS, OperatorConfig, SettingsError
from compaction_operator.webhook import ServiceWebhookServer, choose_policy, webhook_server
from operator_samples import REPO
from ports import free_port


def test_defaults() -> None:
    config = OperatorConfig.from_env({})
    assert config == OperatorConfig(identity=config.identity)
    assert config.clusterwide and not config.webhook_enabled and not config.leader_election


def test_everything_from_the_environment() -> None:
    config = OperatorConfig.from_env({
        "KAFKA_CLEANER_WATCH_NAMESPACES": "kafka, kafka-b,,kafka",
        "KAFKA_CLEANER_LOG_LEVEL": "debug", "KAFKA_CLEANER_LOG_FORMAT": "JSON",
        "KAFKA_CLEANER_SIDECAR_IMAGE": "ghcr.io/x/kafka-cleaner:1.0",
        "KAFKA_CLEANER_HTTP_PORT": "0", "KAFKA_CLEANER_SCRAPE_TIMEOUT_SECONDS": "2.5",
        "KAFKA_CLEANER_LEADER_ELECTION": "true", "KAFKA_CLEANER_LEASE_NAME": "lease",
        "KAFKA_CLEANER_WEBHOOK_ENABLED": "yes", "KAFKA_CLEANER_WEBHOOK_CERT_FILE": "/certs/tls.crt",
        "KAFKA_CLEANER_WEBHOOK_KEY_FILE": "/certs/tls.key", "KAFKA_CLEANER_WEBHOOK_SERVICE_NAME": "op-webhook",
        "KAFKA_CLEANER_WEBHOOK_OBJECT_SELECTOR": "strimzi.io/kind=Kafka, kafkacleaner.io/inject",
        "POD_NAME": "op-7d9f-abc", "POD_NAMESPACE": "ops",
    })
    assert config.namespaces == ("kafka", "kafka-b") and not config.clusterwide
    assert (config.log_level, config.log_format) == ("DEBUG", "json")
    assert config.sidecar_image == "ghcr.io/x/kafka-cleaner:1.0" and config.http_port == 0
    assert config.scrape_timeout == 2.5
    assert config.leader_election and config.lease_name == "lease" and config.lease_namespace == "ops"
    assert config.identity == "op-7d9f-abc" and config.namespace == "ops"
    assert config.webhook_enabled and config.webhook_service_name == "op-webhook"
    server = webhook_server(config)
    assert isinstance(server, ServiceWebhookServer) and server.service_namespace == "ops"  # POD_NAMESPACE
    assert config.webhook_object_selector == (("strimzi.io/kind", "Kafka"), ("kafkacleaner.io/inject", None))


@pytest.mark.parametrize(("env", "message"), [
    ({"KAFKA_CLEANER_LOG_LEVEL": "loud"}, "KAFKA_CLEANER_LOG_LEVEL"),
    ({"KAFKA_CLEANER_LEADER_ELECTION": "maybe"}, "KAFKA_CLEANER_LEADER_ELECTION must be true or false"),
    ({"KAFKA_CLEANER_HTTP_PORT": "http"}, "KAFKA_CLEANER_HTTP_PORT must be an integer"),
    ({"KAFKA_CLEANER_LEASE_RENEW_DEADLINE_SECONDS": "20"}, "RETRY_PERIOD_SECONDS <"),
    ({"KAFKA_CLEANER_WEBHOOK_ENABLED": "true"}, "KAFKA_CLEANER_WEBHOOK_CERT_FILE"),
    ({"KAFKA_CLEANER_WEBHOOK_OBJECT_SELECTOR": "a b=c"}, "not a label requirement"),
])
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        OperatorConfig.from_env(env)


def test_every_setting_is_documented() -> None:
    docs = (REPO / "docs" / "operator.md").read_text()
    chart = (REPO / "helm" / "kafka-cleaner-operator" / "templates" / "deployment.yaml").read_text()
    for name, _, _ in ENV_VARS:
        assert f"`{name}`" in docs, name
        if name.startswith("KAFKA_CLEANER_") and name not in ("KAFKA_CLEANER_WEBHOOK_INSECURE",
                                                              "KAFKA_CLEANER_WEBHOOK_HOST",
                                                              "KAFKA_CLEANER_HTTP_ADDR",
                                                              "KAFKA_CLEANER_WEBHOOK_ADDR"):
            assert name in chart, f"{name} is not set by the chart's Deployment"


def test_console_script_help_lists_the_settings() -> None:
    result = subprocess.run([sys.executable, "-P", "-m", "compaction_operator.main", "--help"],
                            capture_output=True, text=True, check=True, timeout=60)
    assert "KAFKA_CLEANER_WATCH_NAMESPACES" in result.stdout


def test_bad_settings_exit_with_2() -> None:
    result = subprocess.run([sys.executable, "-P", "-m", "compaction_operator.main"], capture_output=True,
                            text=True, timeout=60, env={"KAFKA_CLEANER_LOG_LEVEL": "loud", "PATH": "/usr/bin"})
    assert result.returncode == 2 and "KAFKA_CLEANER_LOG_LEVEL" in result.stderr


def test_kopf_settings() -> None:
    settings = build_settings(OperatorConfig())
    assert settings.persistence.finalizer == FINALIZER
    assert settings.posting.level == logging.WARNING
    assert settings.admission.server is None
    webhook = OperatorConfig(webhook_enabled=True, webhook_cert_file="/c/tls.crt", webhook_key_file="/c/tls.key",
                             webhook_ca_file="/c/ca.crt", webhook_service_name="svc", namespace="ops")
    settings = build_settings(webhook)
    server = settings.admission.server
    assert isinstance(server, ServiceWebhookServer) and server.service_namespace == "ops"
    assert (server.certfile, server.pkeyfile, server.cafile) == ("/c/tls.crt", "/c/tls.key", "/c/ca.crt")
    assert settings.admission.managed is None  # the chart deploys the configuration
    managed = build_settings(OperatorConfig(webhook_enabled=True, webhook_insecure=True,
                                            webhook_configuration="kco.kafkacleaner.io"))
    # Never kopf's managed configuration: the server publishes the operator's own (the chart's).
    assert managed.admission.managed is None and managed.admission.server.publish is not None
    plain = webhook_server(OperatorConfig(webhook_enabled=True, webhook_insecure=True, webhook_port=1234))
    assert isinstance(plain, kopf.WebhookServer) and plain.insecure and plain.port == 1234


def test_the_webhook_server_listens_only_once_its_gate_opens() -> None:
    """Before the operator's policy index is complete nothing listens on the webhook port, so
    the API server's failurePolicy applies (and /readyz says not ready: main.is_ready)."""
    import asyncio
    import socket
    import threading

    from compaction_operator.main import is_ready

    port = free_port()
    gate = threading.Event()
    server = webhook_server(OperatorConfig(webhook_enabled=True, webhook_insecure=True, webhook_addr="127.0.0.1",
                                           webhook_port=port), gate=gate)

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    async def main() -> list[bool]:
        async def fn(*_: Any, **__: Any) -> dict[str, Any]:
            return {}

        seen = []
        configs = server(fn)
        first = asyncio.ensure_future(configs.__anext__())
        for _ in range(10):
            await asyncio.sleep(0.05)
            seen.append(first.done() or listening())
        gate.set()
        config = await asyncio.wait_for(first, 10)
        seen.append(listening() and config["url"].startswith("http://"))
        await configs.aclose()
        return seen

    seen = asyncio.run(main())
    assert seen[:-1] == [False] * 10 and seen[-1], seen

    config = OperatorConfig(webhook_enabled=True, webhook_insecure=True)
    kopf_ready, hook_ready = threading.Event(), threading.Event()
    kopf_ready.set()
    assert not is_ready(config, kopf_ready, hook_ready)
    hook_ready.set()
    assert is_ready(config, kopf_ready, hook_ready)
    assert is_ready(OperatorConfig(), kopf_ready, threading.Event())  # no webhook: kopf alone


# -------------------------------------------------------------------------------------------
# Which policy injects into a new pod
# -------------------------------------------------------------------------------------------


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kafkacleaner.io/v1alpha1", "kind": "CompactionPolicy",
            "metadata": {"name": name, "namespace": "kafka", "generation": 1}, "spec": spec}


STRIMZI = {"podSelector": {"matchLabels": {"strimzi.io/kind": "Kafka"}}, "dataVolume": "data-0",
           "mountPath": "/var/lib/kafka/data-0", "logDirs": ["kafka-log*"]}


def pod(labels: dict[str, str], volumes: tuple[str, ...] = ("data-0",), owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "my-cluster-broker-0", "namespace": "kafka", "labels": labels}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner, "uid": "u"}]
    return {"metadata": meta, "spec": {"containers": [{"name": "kafka", "image": "strimzi/kafka"}],
                                       "volumes": [{"name": v, "emptyDir": {}} for v in volumes]}}


def test_the_matching_webhook_policy_is_chosen() -> None:
    policies = [manifest("b-strimzi", target=STRIMZI),
                manifest("a-sts", target={**STRIMZI, "podSelector": None, "statefulSet": "kafka"}),
                manifest("c-other", target={**STRIMZI, "podSelector": {"matchLabels": {"app": "other"}}})]
    choice = choose_policy(pod({"strimzi.io/kind": "Kafka"}), policies)
    assert choice.policy is not None and choice.policy.name == "b-strimzi" and choice.warnings == ()
    assert choose_policy(pod({"app": "zookeeper"}), policies).policy is None


def test_statefulset_target_with_webhook_injection_selects_its_pods() -> None:
    target = {**STRIMZI, "podSelector": None, "statefulSet": "kafka", "injection": "webhook"}
    choice = choose_policy(pod({}, owner="kafka"), [manifest("p", target=target)])
    assert choice.policy is not None
    assert choose_policy(pod({}, owner="other"), [manifest("p", target=target)]).policy is None


def test_ambiguity_missing_volume_and_invalid_policies() -> None:
    two = [manifest("x", target=STRIMZI), manifest("y", target=STRIMZI)]
    choice = choose_policy(pod({"strimzi.io/kind": "Kafka"}), two)
    assert choice.policy is not None and choice.policy.name == "x"
    assert "only x injects" in choice.warnings[0]
    assert choice.overlapping == ("x", "y")  # both policies get an OverlappingPolicies Event
    assert choose_policy(pod({"strimzi.io/kind": "Kafka"}), two[:1]).overlapping == ()
    choice = choose_policy(pod({"strimzi.io/kind": "Kafka"}, volumes=("data",)), two[:1])
    assert choice.policy is None and "no volume 'data-0'" in choice.warnings[0]
    bad = manifest("bad", target=STRIMZI, topics=[{"match": "(?<name>x)"}])  # not a Python regex
    assert choose_policy(pod({"strimzi.io/kind": "Kafka"}), [bad]).policy is None
    paused = manifest("paused", target=STRIMZI, paused=True)
    assert choose_policy(pod({"strimzi.io/kind": "Kafka"}), [paused]).policy is not None
