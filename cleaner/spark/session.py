"""The SparkSession the jobs run in.

Under ``spark-submit`` (or any driver that already has a session) the jobs use the active
session and its master. Otherwise they start an embedded one: ``local[*]`` (every core of
this machine, each task attempted up to 4 times as on a cluster: master
``local[*,4]``), quiet (Spark's own log at ERROR, no console progress, no web UI), with
the executors' Python set to this interpreter and ``PYTHONSAFEPATH=1`` (the repository's
``operator/`` directory would shadow the standard library's ``operator`` module in a
worker started from the repository root).

Speculative execution must be off: a speculative copy of a task would be harmless to the
staged output (attempt directories are renamed, the first wins), but the jobs' contract
is one successful attempt per unit of work, and the check makes a misconfigured cluster
fail at once instead of doing work twice.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from cleaner.errors import KafkaCleanerError

DEFAULT_MASTER = "local[*,4]"
MASTER_ENV = "KAFKA_CLEANER_SPARK_MASTER"

LOG4J2_PROPERTIES = """\
# kafka-cleaner: Spark's own logging at ERROR, on stderr.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# The logger of the class that starts logging decides the "Setting default log level" banner
# (the Scala shell's, pyspark's gateway): at the root's level, there is no banner.
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""

_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.speculation": "false",
    "spark.executorEnv.PYTHONSAFEPATH": "1",
    "spark.python.worker.reuse": "true",
}
_LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def use_quiet_log_configuration() -> None:
    """Point ``SPARK_CONF_DIR`` at a temporary directory holding ``LOG4J2_PROPERTIES``,
    unless the user has one of their own. The JVM reads it once, at its launch; the directory
    is removed when this driver exits (each run of a job would otherwise leave one behind)."""
    if "SPARK_CONF_DIR" in os.environ:
        return
    d = tempfile.mkdtemp(prefix="kafka-cleaner-spark-conf-")
    atexit.register(shutil.rmtree, d, True)
    Path(d, "log4j2.properties").write_text(LOG4J2_PROPERTIES)
    os.environ["SPARK_CONF_DIR"] = d


def spark_session(
    master: str | None = None, *, app_name: str = "kafka-cleaner", conf: dict[str, str] | None = None
) -> Any:
    """The active SparkSession, or a new one (see the module doc)."""
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
        builder = SparkSession.builder.appName(app_name)
        for k, v in {**_CONF, **(conf or {})}.items():
            builder = builder.config(k, v)
        if not submitted:
            master = master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            use_quiet_log_configuration()
            if master.startswith("local"):
                os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
                for k, v in _LOCAL_CONF.items():
                    builder = builder.config(k, v)
            builder = builder.master(master).config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        elif master:
            builder = builder.master(master)
        active = builder.getOrCreate()
    check_session(active)
    return active


def check_session(spark: Any) -> None:
    """Refuse a session the exactly-once protocol was not designed for."""
    if spark.sparkContext.getConf().get("spark.speculation", "false").strip().lower() == "true":
        raise KafkaCleanerError("spark.speculation must be false for kafka-cleaner's Spark jobs")


def tasks_per_executor(sc: Any) -> int:
    """How many of a job's tasks one executor runs at once: its cores over
    ``spark.task.cpus`` (in local mode, the one executor has the master's cores; in a cluster
    without ``spark.executor.cores``, an executor takes its worker's cores: the cores at
    submit time over the executors)."""
    conf = sc.getConf()
    task_cpus = max(int(conf.get("spark.task.cpus", "1")), 1)
    cores = conf.get("spark.executor.cores")
    if sc.master.startswith("local") or cores is None:
        executors = 1 if sc.master.startswith("local") else max(sc._jsc.sc().getExecutorMemoryStatus().size() - 1, 1)
        return max(sc.defaultParallelism // executors // task_cpus, 1)
    return max(int(cores) // task_cpus, 1)


def task_io_rate(sc: Any, rate: float | None) -> float | None:
    """A task's share of the policy's ``maxIoBytesPerSecond``: the rate is each executor's (as
    Kafka's is each broker's, shared by its cleaner threads), divided among the tasks it runs
    at once."""
    return None if rate is None else rate / tasks_per_executor(sc)
