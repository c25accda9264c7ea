"""A real standalone Spark cluster on this machine: one master and two workers, each a JVM
started from the PySpark wheel's own ``bin/spark-class`` (the same jars ``spark-submit``
runs), bound to 127.0.0.1 on ports each daemon picks itself (port 0; the master's are read
back from its log), with small memory and their work dirs under the test's directory. Used
by ``test_spark_standalone.py`` to run the jobs as a user does: ``spark-submit --master
spark://...`` of ``cleaner/spark/submit.py``.

Readiness and progress are read from the master's JSON API (``http://127.0.0.1:<ui>/json/``),
never guessed with a sleep.

No port is chosen here and bound later by a JVM: a port found free and released can be taken
by anything else on the machine before the daemon binds it (a fresh-clone CI run found a
Spark web page at the master's UI port, not the master's JSON), so the daemons bind port 0
and the master says in its log which ports it got.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

from cleaner.spark.session import LOG4J2_PROPERTIES

SPARK_HOME = Path(pyspark.__file__).parent
WORKERS = 2
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"
DAEMON_MEMORY = "256m"
READY_WITHIN_S = 120.0


# Spark's own line when a service is up: Utils.startServiceOnPort, at INFO.
STARTED_SERVICE = re.compile(r"Successfully started service '(?P<name>\w+)' on port (?P<port>\d+)")
DAEMON_LOG4J2 = (
    LOG4J2_PROPERTIES
    + """\
# The test cluster reads the ports its daemons bound from this logger's lines.
logger.ports.name = org.apache.spark.util.Utils
logger.ports.level = info
"""
)


def wait_for(what: str, condition: Callable[[], Any], within_s: float, procs: list[subprocess.Popen]) -> Any:
    """Poll ``condition`` until it is truthy; fail at once if a daemon died, or after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        value = condition()
        if value:
            return value
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"waiting for {what}: a Spark daemon exited: {dead}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {within_s} s")
        time.sleep(0.05)


@dataclass
class StandaloneCluster:
    """A running master and its workers (``start``), stopped by ``stop``."""

    base: Path
    master_port: int = 0
    ui_port: int = 0
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def env(self) -> dict[str, str]:
        conf = self.base / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "log4j2.properties").write_text(DAEMON_LOG4J2)
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_CONF_DIR": str(conf),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.base / "logs"),
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONSAFEPATH": "1",
            # The REST submission server listens on a fixed port (6066) nobody here uses.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }

    def _daemon(self, name: str, cls: str, *args: str) -> None:
        (self.base / "logs").mkdir(exist_ok=True)
        log = open(self.base / "logs" / f"{name}.out", "wb")  # noqa: SIM115 - the daemon's stdout for its lifetime
        self.procs.append(
            subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), cls, *args],
                env=self.env(),
                cwd=self.base,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends the JVM and its children
            )
        )
        log.close()

    def _bound_ports(self, name: str) -> dict[str, int]:
        """The services a daemon has started so far and their ports, from its log."""
        try:
            text = (self.base / "logs" / f"{name}.out").read_text(errors="replace")
        except FileNotFoundError:
            return {}
        return {m["name"]: int(m["port"]) for m in STARTED_SERVICE.finditer(text)}

    def start(self) -> StandaloneCluster:
        self.base.mkdir(parents=True, exist_ok=True)
        self._daemon(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
        )  # fmt: skip
        ports = wait_for(
            "the master's RPC and web UI ports",
            lambda: (p := self._bound_ports("master")).keys() >= {"sparkMaster", "MasterUI"} and p,
            READY_WITHIN_S,
            self.procs,
        )
        self.master_port, self.ui_port = ports["sparkMaster"], ports["MasterUI"]
        for i in range(WORKERS):
            work = self.base / f"worker-{i}"
            work.mkdir()
            self._daemon(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                "--cores", "1", "--memory", WORKER_MEMORY, "--work-dir", str(work), self.url,
            )  # fmt: skip
        wait_for(
            f"{WORKERS} alive workers",
            lambda: len([w for w in self.workers() if w.get("state") == "ALIVE"]) == WORKERS,
            READY_WITHIN_S,
            self.procs,
        )
        return self

    def state(self) -> dict[str, Any]:
        """The master's JSON API (workers, active and completed applications); {} while it is not up.
        Anything but this master's JSON at its UI port is an error that says what answered."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                body = r.read()
        except OSError:
            return {}
        try:
            state = json.loads(body)
        except ValueError:
            raise RuntimeError(f"not the master's JSON at 127.0.0.1:{self.ui_port}/json/: {body[:200]!r}") from None
        if state.get("url") != self.url:
            raise RuntimeError(f"another master at 127.0.0.1:{self.ui_port}: {state.get('url')!r}, not {self.url}")
        return state

    def workers(self) -> list[dict[str, Any]]:
        return self.state().get("workers", [])

    def submit_command(self, app: Path, *args: str, executor_env: dict[str, str] | None = None) -> list[str]:
        """``spark-submit`` of a Python application to this cluster, small executors, one per
        worker; ``executor_env``: more of the executors' environment (``spark.executorEnv.*``)."""
        more = [c for name, value in (executor_env or {}).items()
                for c in ("--conf", f"spark.executorEnv.{name}={value}")]  # fmt: skip
        return [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master", self.url,
            "--conf", f"spark.executor.memory={EXECUTOR_MEMORY}",
            "--conf", "spark.executor.cores=1",
            "--conf", "spark.driver.memory=512m",
            "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.ui.showConsoleProgress=false",
            "--conf", f"spark.pyspark.python={sys.executable}",
            "--conf", "spark.executorEnv.PYTHONSAFEPATH=1",
            *more,
            str(app), *args,
        ]  # fmt: skip

    def executor_pids(self) -> dict[int, str]:
        """The executor JVMs the workers started (``CoarseGrainedExecutorBackend``), each with
        its application's id."""
        out = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                cwd = Path(os.readlink(proc / "cwd"))
            except OSError:
                continue
            # A worker runs each executor in <work dir>/<app id>/<executor id>.
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline and self.base in cwd.parents:
                out[int(proc.name)] = cwd.parent.name
        return out

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
