"""The operator's settings, all from environment variables (the Helm chart sets them).

:meth:`OperatorConfig.from_env` reads and checks them; docs/operator.md lists them. Pure: the
environment is passed in, so tests build configurations without touching ``os.environ``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
from collections.abc import Mapping

from compaction_operator.injection import image_repository

__all__ = ["ENV_PREFIX", "OperatorConfig", "SettingsError", "describe_env"]

ENV_PREFIX = "KAFKA_CLEANER_"

#: (variable, default, meaning) for ``--help`` and the docs.
ENV_VARS: tuple[tuple[str, str, str], ...] = (
    ("KAFKA_CLEANER_WATCH_NAMESPACES", "", "comma-separated namespaces to watch; empty: all namespaces"),
    ("KAFKA_CLEANER_LOG_LEVEL", "INFO", "DEBUG, INFO, WARNING or ERROR"),
    ("KAFKA_CLEANER_LOG_FORMAT", "full", "plain, full or json (kopf's log formats)"),
    ("KAFKA_CLEANER_SIDECAR_IMAGE", "", "image of the injected sidecar when a policy sets no sidecar.image "
     "(the chart sets the operator's own image)"),
    ("KAFKA_CLEANER_HTTP_ADDR", "0.0.0.0", "address of the operator's /metrics, /healthz and /readyz"),
    ("KAFKA_CLEANER_HTTP_PORT", "8080", "port of /metrics, /healthz and /readyz; 0: do not serve"),
    ("KAFKA_CLEANER_SCRAPE_TIMEOUT_SECONDS", "5", "timeout of one GET /status of a sidecar"),
    ("KAFKA_CLEANER_LEADER_ELECTION", "false", "elect a leader through a coordination.k8s.io Lease "
     "(for more than one replica); only the leader reconciles, every replica serves the webhook"),
    ("KAFKA_CLEANER_LEASE_NAME", "kafka-cleaner-operator", "name of the Lease"),
    ("KAFKA_CLEANER_LEASE_NAMESPACE", "", "namespace of the Lease; empty: POD_NAMESPACE"),
    ("KAFKA_CLEANER_LEASE_DURATION_SECONDS", "15", "how long a leader's Lease is valid without renewal"),
    ("KAFKA_CLEANER_LEASE_RENEW_DEADLINE_SECONDS", "10", "a leader that cannot renew for this long steps down "
     "(the process exits and is restarted as a candidate)"),
    ("KAFKA_CLEANER_LEASE_RETRY_PERIOD_SECONDS", "2", "how often candidates try and the leader renews"),
    ("KAFKA_CLEANER_WEBHOOK_ENABLED", "false", "serve the mutating admission webhook that injects the sidecar "
     "into pods of injection: webhook policies"),
    ("KAFKA_CLEANER_WEBHOOK_ADDR", "0.0.0.0", "listen address of the webhook server"),
    ("KAFKA_CLEANER_WEBHOOK_PORT", "9443", "listen port of the webhook server"),
    ("KAFKA_CLEANER_WEBHOOK_CERT_FILE", "", "TLS certificate (PEM) of the webhook server"),
    ("KAFKA_CLEANER_WEBHOOK_KEY_FILE", "", "its private key (PEM)"),
    ("KAFKA_CLEANER_WEBHOOK_CA_FILE", "", "CA bundle the API server verifies the webhook with (caBundle)"),
    ("KAFKA_CLEANER_WEBHOOK_INSECURE", "false", "plain HTTP (local testing only: API servers require HTTPS)"),
    ("KAFKA_CLEANER_WEBHOOK_SERVICE_NAME", "", "Service in front of the webhook server; empty: use a URL"),
    ("KAFKA_CLEANER_WEBHOOK_SERVICE_NAMESPACE", "", "its namespace; empty: POD_NAMESPACE"),
    ("KAFKA_CLEANER_WEBHOOK_SERVICE_PORT", "443", "its port"),
    ("KAFKA_CLEANER_WEBHOOK_HOST", "", "host name in the webhook URL when no Service is set"),
    ("KAFKA_CLEANER_WEBHOOK_CONFIGURATION", "", "name of a MutatingWebhookConfiguration for the operator to "
     "create and keep up to date (the same as the chart's: failurePolicy Ignore, the timeout, the object and "
     "namespace selectors); empty: the configuration is deployed with the operator (the Helm chart renders it)"),
    ("KAFKA_CLEANER_WEBHOOK_TIMEOUT_SECONDS", "5", "timeoutSeconds of the configuration the operator manages "
     "(1-30; the chart passes webhook.timeoutSeconds)"),
    ("KAFKA_CLEANER_WEBHOOK_OBJECT_SELECTOR", "", "labels a pod must have to be sent to the webhook "
     "(key=value or key, comma-separated); empty: every pod created in the cluster"),
    # -- what a policy author may choose (issue 20, item 7) --
    ("KAFKA_CLEANER_ALLOWED_SIDECAR_IMAGES", "", "comma-separated image repositories (no tag) a policy's "
     "spec.sidecar.image may name, any tag or digest of them; empty: the repository of "
     "KAFKA_CLEANER_SIDECAR_IMAGE (none without it)"),
    # -- the replication race (issue 24, item 3) --
    ("KAFKA_CLEANER_RACE_GUARD_BOOTSTRAP_SERVERS", "", "Kafka bootstrap servers (host:port, comma-separated) "
     "of the brokers the policies cover; set: the race guard holds Kafka's own cleaner off a compacted topic "
     "while a replica of it is out of sync, through the Admin API (docs/replica-divergence.md); empty: off"),
    ("KAFKA_CLEANER_RACE_GUARD_ADMIN_CONFIG", "", "a JSON object of kafka-python KafkaAdminClient options for "
     "it (security_protocol, ssl_cafile, sasl_mechanism, sasl_plain_username, ...); put it in a Secret and "
     "pass it with extraEnv valueFrom"),
    ("POD_NAME", "<host name>", "this replica's identity in the Lease (downward API)"),
    ("POD_NAMESPACE", "default", "the operator's namespace (downward API)"),
)


class SettingsError(ValueError):
    """A malformed environment variable; the message names it."""


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")


def _number(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0,
            maximum: float | None = None, integer: bool = False) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a{'n integer' if integer else ' number'}, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name} must be >= {minimum}, got {raw!r}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name} must be <= {maximum}, got {raw!r}")
    return value


_LABEL = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _object_selector(raw: str) -> dict[str, str | None]:
    """``a=b,c`` -> ``{"a": "b", "c": None}`` (None: the label must exist)."""
    out: dict[str, str | None] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not _LABEL.match(key) or (sep and not _VALUE.match(value)):
            raise SettingsError(f"KAFKA_CLEANER_WEBHOOK_OBJECT_SELECTOR: not a label requirement: {part!r}")
        out[key] = value if sep else None
    return out


def _image_repositories(raw: str) -> tuple[str, ...]:
    """``a/b, c/d`` -> ``("a/b", "c/d")``; an entry with a tag or digest is refused (an entry
    names a repository, and a tag in it would silently allow nothing)."""
    out = tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))
    for entry in out:
        if image_repository(entry) != entry:
            raise SettingsError(f"KAFKA_CLEANER_ALLOWED_SIDECAR_IMAGES: {entry!r} has a tag or digest; name the "
                                f"repository only ({image_repository(entry)!r})")
    return out


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    log_level: str = "INFO"
    log_format: str = "full"
    sidecar_image: str | None = None
    http_addr: str = "0.0.0.0"
    http_port: int = 8080
    scrape_timeout: float = 5.0
    leader_election: bool = False
    lease_name: str = "kafka-cleaner-operator"
    lease_namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str = "kafka-cleaner-operator"
    namespace: str = "default"
    webhook_enabled: bool = False
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_cert_file: str | None = None
    webhook_key_file: str | None = None
    webhook_ca_file: str | None = None
    webhook_insecure: bool = False
    webhook_service_name: str | None = None
    webhook_service_namespace: str | None = None
    webhook_service_port: int = 443
    webhook_host: str | None = None
    webhook_configuration: str | None = None
    webhook_object_selector: tuple[tuple[str, str | None], ...] = ()
    webhook_timeout: int = 5
    # -- what a policy author may choose (issue 20, item 7) --
    #: Image repositories the sidecar may run (:attr:`sidecar_image_allowlist`).
    allowed_sidecar_images: tuple[str, ...] = ()
    # -- the replication race (issue 24, item 3) --
    #: Set: the race guard (``race_guard.py``) is on, against these brokers.
    race_guard_bootstrap: str | None = None
    #: KafkaAdminClient options (a JSON object) for it.
    race_guard_admin_config: str = "{}"

    @property
    def race_guard_options(self) -> dict[str, object]:
        return dict(json.loads(self.race_guard_admin_config))

    @property
    def sidecar_image_allowlist(self) -> tuple[str, ...]:
        """The repositories ``spec.sidecar.image`` may name: the configured ones, else the
        default sidecar image's own (a policy may pick another tag of it, no other program)."""
        if self.allowed_sidecar_images:
            return self.allowed_sidecar_images
        return (image_repository(self.sidecar_image),) if self.sidecar_image else ()

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorConfig:
        """The settings from ``env`` (``os.environ``); raises :class:`SettingsError`."""
        def text(name: str, default: str = "") -> str:
            return env.get(name, "").strip() or default

        namespaces = tuple(dict.fromkeys(n.strip() for n in text(ENV_PREFIX + "WATCH_NAMESPACES").split(",")
                                         if n.strip()))
        level = text(ENV_PREFIX + "LOG_LEVEL", "INFO").upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise SettingsError(f"KAFKA_CLEANER_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR, got {level!r}")
        log_format = text(ENV_PREFIX + "LOG_FORMAT", "full").lower()
        if log_format not in ("plain", "full", "json"):
            raise SettingsError(f"KAFKA_CLEANER_LOG_FORMAT must be plain, full or json, got {log_format!r}")
        namespace = text("POD_NAMESPACE", "default")
        lease_duration = _number(env, ENV_PREFIX + "LEASE_DURATION_SECONDS", 15.0, minimum=1)
        renew_deadline = _number(env, ENV_PREFIX + "LEASE_RENEW_DEADLINE_SECONDS", 10.0, minimum=1)
        retry_period = _number(env, ENV_PREFIX + "LEASE_RETRY_PERIOD_SECONDS", 2.0, minimum=0.1)
        if not retry_period < renew_deadline < lease_duration:
            raise SettingsError("the lease settings must satisfy KAFKA_CLEANER_LEASE_RETRY_PERIOD_SECONDS < "
                                "KAFKA_CLEANER_LEASE_RENEW_DEADLINE_SECONDS < KAFKA_CLEANER_LEASE_DURATION_SECONDS")
        config = cls(
            namespaces=namespaces,
            log_level=level,
            log_format=log_format,
            sidecar_image=text(ENV_PREFIX + "SIDECAR_IMAGE") or None,
            http_addr=text(ENV_PREFIX + "HTTP_ADDR", "0.0.0.0"),
            http_port=int(_number(env, ENV_PREFIX + "HTTP_PORT", 8080, integer=True)),
            scrape_timeout=_number(env, ENV_PREFIX + "SCRAPE_TIMEOUT_SECONDS", 5.0, minimum=0.1),
            leader_election=_flag(env, ENV_PREFIX + "LEADER_ELECTION", False),
            lease_name=text(ENV_PREFIX + "LEASE_NAME", "kafka-cleaner-operator"),
            lease_namespace=text(ENV_PREFIX + "LEASE_NAMESPACE", namespace),
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
            identity=text("POD_NAME") or socket.gethostname(),
            namespace=namespace,
            webhook_enabled=_flag(env, ENV_PREFIX + "WEBHOOK_ENABLED", False),
            webhook_addr=text(ENV_PREFIX + "WEBHOOK_ADDR", "0.0.0.0"),
            webhook_port=int(_number(env, ENV_PREFIX + "WEBHOOK_PORT", 9443, minimum=1, integer=True)),
            webhook_cert_file=text(ENV_PREFIX + "WEBHOOK_CERT_FILE") or None,
            webhook_key_file=text(ENV_PREFIX + "WEBHOOK_KEY_FILE") or None,
            webhook_ca_file=text(ENV_PREFIX + "WEBHOOK_CA_FILE") or None,
            webhook_insecure=_flag(env, ENV_PREFIX + "WEBHOOK_INSECURE", False),
            webhook_service_name=text(ENV_PREFIX + "WEBHOOK_SERVICE_NAME") or None,
            webhook_service_namespace=text(ENV_PREFIX + "WEBHOOK_SERVICE_NAMESPACE") or None,
            webhook_service_port=int(_number(env, ENV_PREFIX + "WEBHOOK_SERVICE_PORT", 443, minimum=1,
                                             integer=True)),
            webhook_host=text(ENV_PREFIX + "WEBHOOK_HOST") or None,
            webhook_configuration=text(ENV_PREFIX + "WEBHOOK_CONFIGURATION") or None,
            webhook_object_selector=tuple(_object_selector(text(ENV_PREFIX + "WEBHOOK_OBJECT_SELECTOR")).items()),
            webhook_timeout=int(_number(env, ENV_PREFIX + "WEBHOOK_TIMEOUT_SECONDS", 5, minimum=1, maximum=30,
                                        integer=True)),
            allowed_sidecar_images=_image_repositories(text(ENV_PREFIX + "ALLOWED_SIDECAR_IMAGES")),
            race_guard_bootstrap=text(ENV_PREFIX + "RACE_GUARD_BOOTSTRAP_SERVERS") or None,
            race_guard_admin_config=_json_object(env, ENV_PREFIX + "RACE_GUARD_ADMIN_CONFIG"),
        )
        if config.webhook_enabled and not config.webhook_insecure and not (
                config.webhook_cert_file and config.webhook_key_file):
            raise SettingsError("the webhook needs KAFKA_CLEANER_WEBHOOK_CERT_FILE and "
                                "KAFKA_CLEANER_WEBHOOK_KEY_FILE (or KAFKA_CLEANER_WEBHOOK_INSECURE=true for "
                                "local tests)")
        return config


def _json_object(env: Mapping[str, str], name: str) -> str:
    raw = env.get(name, "").strip() or "{}"
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise SettingsError(f"{name} must be a JSON object: {e}") from None
    if not isinstance(value, dict):
        raise SettingsError(f"{name} must be a JSON object, got {type(value).__name__}")
    return raw


def describe_env() -> str:
    """The environment variables, for ``kafka-cleaner-operator --help``."""
    width = max(len(name) for name, _, _ in ENV_VARS)
    lines = [f"  {name:<{width}}  {meaning} (default: {default or 'unset'})" for name, default, meaning in ENV_VARS]
    return "\n".join(lines)
