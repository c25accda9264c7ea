"""A real standalone Spark cluster on this machine: one master and two workers, each a JVM
started from the PySpark wheel's own ``bin/spark-class`` (the same jars ``spark-submit``
runs), bound to 127.0.0.1 on free ports, with small memory and their work dirs under the
test's directory. Used by ``test_spark_standalone.py`` to run the jobs as a user does:
``spark-submit --master spark://...`` of ``cleaner/spark/submit.py``.

Readiness and progress are read from the master's JSON API (``http://127.0.0.1:<ui>/json/``),
never guessed with a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import socket
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    master_port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def env(self) -> dict[str, str]:
        conf = self.base / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
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

    def start(self) -> StandaloneCluster:
        self.base.mkdir(parents=True, exist_ok=True)
        self._daemon(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.master_port), "--webui-port", str(self.ui_port),
        )  # fmt: skip
        for i in range(WORKERS):
            work = self.base / f"worker-{i}"
            work.mkdir()
            self._daemon(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()),
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
        """The master's JSON API (workers, active and completed applications); {} while it is not up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                return json.load(r)
        except OSError:
            return {}

    def workers(self) -> list[dict[str, Any]]:
        return self.state().get("workers", [])

    def submit_command(self, app: Path, *args: str) -> list[str]:
        """``spark-submit`` of a Python application to this cluster, small executors, one per worker."""
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
