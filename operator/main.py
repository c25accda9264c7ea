"""Entry point of ``kafka-cleaner-operator``: settings from the environment, then kopf.

``kafka-cleaner-operator`` takes no options (``--help`` lists the environment variables, which
docs/operator.md describes); ``kafka-cleaner-operator where`` is the one command beside it
(:mod:`compaction_operator.where`). It serves /metrics, /healthz and /readyz and runs kopf with the
handlers of :mod:`compaction_operator.handlers`, in standalone mode (no kopf peering: kopf's
peering pauses every replica of equal priority, so it is no HA mechanism).

With leader election (``KAFKA_CLEANER_LEADER_ELECTION=true``), replicas compete for a Lease.
Until it wins, a replica is a *follower*: it reconciles nothing, but if the webhook is
enabled it serves it (kopf with just the policy index and the mutating handler), so every
replica behind the webhook Service answers. A follower is ready (/readyz) once its webhook
answers, so rolling updates of the Deployment proceed. On winning, it stops the follower run and starts the full
operator. A leader that cannot renew its Lease within the renew deadline exits at once with
status 1 (nothing it started may write after that), to be restarted as a follower.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading

import kopf
import kubernetes
from compaction_operator import metrics
from compaction_operator.handlers import Operator, build_registry, build_settings
from compaction_operator.kube import Kube, load_config
from compaction_operator.leader import LeaseElector
from compaction_operator.settings import OperatorConfig, SettingsError, describe_env

from cleaner import __version__

__all__ = ["main"]

log = logging.getLogger("kafka-cleaner-operator")

_FORMATS = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-cleaner-operator",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The kafka-cleaner operator: reconciles CompactionPolicy resources (kopf).\n\n"
        "kafka-cleaner-operator where --help: where a key is still on the disks of a policy's brokers.",
        epilog="Settings come from the environment:\n" + describe_env(),
    )
    parser.add_argument("--version", action="version", version=f"kafka-cleaner-operator {__version__}")
    return parser


class _Run:
    """One kopf run on an event loop of its own, stoppable from any thread.

    kopf waits for a ``threading.Event`` stop flag in an executor thread, which then blocks the
    loop's shutdown when kopf exits for another reason (SIGTERM); an ``asyncio.Event`` set
    through the loop has no such thread.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stop_flag = asyncio.Event()

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over anyway
            self.loop.call_soon_threadsafe(self.stop_flag.set)

    def run(self, config: OperatorConfig, *, ready: threading.Event, webhook_ready: threading.Event,
            webhook_only: bool = False) -> None:
        operator = Operator(config, webhook_ready=webhook_ready)
        try:
            kopf.run(
                loop=self.loop,
                registry=build_registry(config, operator, webhook_only=webhook_only),
                settings=build_settings(config, operator=operator),
                standalone=True,
                clusterwide=config.clusterwide,
                namespaces=config.namespaces,
                stop_flag=self.stop_flag,
                ready_flag=ready,
            )
        finally:
            webhook_ready.clear()  # this run's webhook server is gone (a hand-over, or the end)
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()


def is_ready(config: OperatorConfig, ready: threading.Event, webhook_ready: threading.Event) -> bool:
    """/readyz: kopf runs and, with the webhook enabled, the webhook can answer (its policy
    index is complete and its server listens). False before the first policy listing and
    during a leader hand-over (the follower's run is over, the leader's not yet serving), so
    the webhook Service sends calls only to replicas that answer them correctly."""
    return ready.is_set() and (not config.webhook_enabled or webhook_ready.is_set())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["where"]:
        from compaction_operator.where import where_command

        where_command.main(args=argv[1:], prog_name="kafka-cleaner-operator where")  # exits
    _parser().parse_args(argv)
    try:
        config = OperatorConfig.from_env(os.environ)
    except SettingsError as exc:
        print(f"kafka-cleaner-operator: {exc}", file=sys.stderr)
        return 2
    kopf.configure(debug=config.log_level == "DEBUG", quiet=config.log_level in ("WARNING", "ERROR"),
                   log_format=_FORMATS[config.log_format])
    if config.log_level == "ERROR":
        logging.getLogger().setLevel(logging.ERROR)

    ready, webhook_ready = threading.Event(), threading.Event()
    server = None
    if config.http_port:
        server = metrics.start_http_server(config.http_addr, config.http_port,
                                           lambda: is_ready(config, ready, webhook_ready))
    try:
        if not config.leader_election:
            metrics.LEADER.set(1)
            _Run().run(config, ready=ready, webhook_ready=webhook_ready)
            return 0
        return _run_with_leader_election(config, ready, webhook_ready)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def _run_with_leader_election(config: OperatorConfig, ready: threading.Event, webhook_ready: threading.Event) -> int:
    load_config()
    elector = LeaseElector(Kube(kubernetes.client.ApiClient()), namespace=config.lease_namespace,
                           name=config.lease_name, identity=config.identity, lease_duration=config.lease_duration,
                           renew_deadline=config.renew_deadline, retry_period=config.retry_period)
    giving_up, leading = threading.Event(), threading.Event()
    follower, leader = _Run(), _Run()
    metrics.LEADER.set(0)

    def on_lost() -> None:
        # Fenced at once: a graceful stop would let kopf's handlers in flight go on writing
        # (deleting a broker, patching a StatefulSet) while another replica takes the Lease.
        # The process exits, as client-go's controllers do, and restarts as a follower.
        log.error("Lost the lease %s/%s: exiting.", config.lease_namespace, config.lease_name)
        metrics.LEADER.set(0)
        logging.shutdown()
        os._exit(1)

    def lead() -> None:
        elector.keep_leading(giving_up, on_lost)  # renew from now on, whatever the main thread does
        metrics.LEADER.set(1)
        leading.set()
        follower.stop()

    def campaign() -> None:
        if elector.acquire(giving_up):
            lead()

    try:
        free = elector.try_acquire_or_renew()  # a free Lease at start: no follower run needed
    except Exception as exc:
        log.warning("Leader election attempt failed: %s", exc)
        free = False
    if free:
        lead()
    else:
        threading.Thread(target=campaign, name="lease-candidate", daemon=True).start()
    try:
        if leading.is_set():
            pass
        elif config.webhook_enabled:
            # Serve the webhook until elected (kopf returns then, or on SIGTERM).
            follower.run(config, ready=ready, webhook_ready=webhook_ready, webhook_only=True)
        else:
            ready.set()  # a candidate that waits is doing all it should
            signal.signal(signal.SIGTERM, lambda *_: giving_up.set())
            signal.signal(signal.SIGINT, lambda *_: giving_up.set())
            while not leading.wait(0.5) and not giving_up.is_set():
                pass
        if not leading.is_set() or giving_up.is_set():
            return 0  # stopped by a signal while following
        log.info("Leading as %s: starting the operator.", config.identity)
        leader.run(config, ready=ready, webhook_ready=webhook_ready)
    finally:
        giving_up.set()
        if leading.is_set():
            elector.release()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
