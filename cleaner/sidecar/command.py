"""``kafka-cleaner sidecar``: the service next to a broker (see ``cleaner.sidecar``)."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import time
from pathlib import Path

import click

from cleaner.clock import SYSTEM_TIME, FixedTime

from .service import Sidecar, SidecarOptions


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


@click.command("sidecar")
@click.option(
    "--policy",
    "policy_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The policy file (the operator's ConfigMap mount); reloaded when it changes.",
)
@click.option(
    "--log-dir",
    "log_dirs",
    multiple=True,
    required=True,
    help="A Kafka log dir (repeatable; shell wildcards are expanded on every scan).",
)
@click.option("--listen", default="0.0.0.0:9410", show_default=True, help="HOST:PORT for /metrics, /status, ...")
@click.option("--broker-name", default=None, help="Reported in /status (default: the host name).")
@click.option("--now-ms", type=int, default=None, help="Fix the clock (epoch ms).")
@click.option(
    "--gate/--no-gate",
    default=True,
    show_default=True,
    help="Run the start-up gate (stage: commit, compact: one bounded pass) before anything else; "
    "--no-gate where the sidecar does not start before the broker (not a native sidecar).",
)
@click.option(
    "--scan-interval-ms",
    type=click.IntRange(min=1),
    default=None,
    hidden=True,
    help="Scan period (default: the policy's reporting.intervalSeconds).",
)
def sidecar_command(
    policy_path: Path,
    log_dirs: tuple[str, ...],
    listen: str,
    broker_name: str | None,
    now_ms: int | None,
    gate: bool,
    scan_interval_ms: int | None,
) -> None:
    """Run next to a Kafka broker: observe, compact or stage (the policy's mode), and serve
    /healthz, /startupz, /readyz, /metrics and /status. SIGTERM stops it within seconds (in
    stage mode after committing, if the broker has exited)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = SidecarOptions(
        policy_path=policy_path,
        log_dir_patterns=list(log_dirs),
        broker_name=broker_name or socket.gethostname(),
        listen=parse_listen(listen),
        scan_interval_ms=scan_interval_ms,
        gate=gate,
    )
    sidecar = Sidecar(options, FixedTime(now_ms) if now_ms is not None else SYSTEM_TIME)
    host, port = sidecar.serve()
    log = logging.getLogger("cleaner.sidecar")
    log.info("listening on %s:%d", host, port)
    received: list[int] = []

    def stop(signum: int, frame: object) -> None:
        received.append(signum)  # logged by the main loop's exit: no logging in a signal handler
        sidecar.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        sidecar.run()
    finally:
        # A person on call reading the pod's last lines sees why it went and that it finished.
        log.info("stopping on %s", signal.Signals(received[0]).name if received else "an error")
        started = time.monotonic()
        sidecar.stop()
        log.info("stopped in %.1f s", time.monotonic() - started)
    sys.exit(0)
