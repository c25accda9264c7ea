"""A real Apache Kafka broker (KRaft; by default one node in combined mode) for the tests, from
the jars ``make setup`` resolves into ``.tools/kafka/<version>/libs`` (both Kafka lines).
A small cluster is a controller-only node (``roles="controller"``) and broker-only nodes that
join its quorum (``quorum=``): what replication, fencing and leader elections need.

Start, stop (SIGTERM or SIGKILL), restart on the same dirs; produce and consume with
kafka-python; ListOffsets; the broker's log and the ERROR/WARN lines in it. The JVM is
tuned for short tests on 2 cores (serial GC, C1 only, 512 MiB heap).

A broker's JVM maps a class-data archive of the line (AppCDS, ``class_archive``): the first
broker of a line that stops cleanly writes it, every later JVM of the line starts from it
(a broker starts in 1.4 s instead of 3.1 s; the crash-start test starts one 25 times a line).
A broker's dirs are formatted by ``kafka-storage format`` once per process and settings, then
copied (``RealBroker._format``): the brokers of one worker then share a cluster id.

The data log dir and the metadata log dir are separate by default (``metadata.log.dir``):
a sidecar given only the data dir then does not see the cluster's topic configs, as with a
broker whose metadata lives on another volume. The broker's own cleaner is off by default
(``log.cleaner.enable=false``) so that what a test finds cleaned is kafka-cleaner's work.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from ports import free_port

REPO = Path(__file__).resolve().parents[1]
KAFKA_LINES = ("4.3.1", "3.9.2")


def libs(line: str) -> Path:
    return REPO / ".tools" / "kafka" / line / "libs"


def available(line: str) -> bool:
    return (libs(line).parent / ".complete").exists()


EACH_KAFKA_LINE = pytest.mark.parametrize(
    "line",
    [
        pytest.param(line, marks=pytest.mark.skipif(not available(line), reason=f"run make setup (Kafka {line})"))
        for line in KAFKA_LINES
    ],
)
"""A test's ``line`` parameter: each Kafka line, skipped (with the reason) without its jars."""


@functools.cache
def class_archive(line: str) -> Path:
    """Where this line's class-data archive is (or will be): ``.tools/kafka/<line>``, named
    after the JVM and the jars (their names, sizes and times), so that a new JDK or new jars
    get an archive of their own instead of one the JVM would refuse (it then starts without,
    slower but correct)."""
    java = Path(shutil.which("java") or "java").resolve()
    stamp = [str(java), str(java.stat().st_mtime_ns if java.exists() else 0)]
    stamp += sorted(f"{e.name}:{e.stat().st_size}:{e.stat().st_mtime_ns}" for e in os.scandir(libs(line)))
    return libs(line).parent / f"broker-{hashlib.sha256(chr(10).join(stamp).encode()).hexdigest()[:12]}.jsa"


_LOG4J2 = """status = error
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
"""
_RELOAD4J = """log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


#: Formatted dirs by what their format depended on (``RealBroker._format_key``), per process.
_FORMATTED: dict[str, Path] = {}


def _new_cluster_id() -> str:
    cluster_id = "-"
    while cluster_id.startswith("-"):  # as Kafka's Uuid.randomUuid: "-..." reads as an option
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return cluster_id


class RealBroker:
    def __init__(
        self,
        root: Path,
        line: str,
        *,
        separate_metadata: bool = True,
        cleaner_enable: bool = False,
        extra: dict[str, str] | None = None,
        node_id: int = 1,
        roles: str = "broker,controller",
        quorum: RealBroker | None = None,
        user: tuple[int, int] | None = None,
    ) -> None:
        self.root = Path(root)
        # (uid, gid) the broker and its format run as (root only; ``root``'s parent must be
        # traversable by it): its files are that uid's, as in a container. None: this process's.
        self.user = user
        self.line = line
        self.log_dir = self.root / "kafka-logs"
        self.metadata_dir = self.root / "metadata" if separate_metadata else self.log_dir
        self.port, self.controller_port = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.config = self.root / "server.properties"
        self.log_file = self.root / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._archive_out: Path | None = None
        """Where the running JVM writes the line's class-data archive at its exit, if it does."""
        self.cluster_id = quorum.cluster_id if quorum is not None else _new_cluster_id()
        self.quorum_member = quorum is not None
        controller = f"CONTROLLER://127.0.0.1:{self.controller_port}"
        broker = f"PLAINTEXT://127.0.0.1:{self.port}"
        listeners = {"controller": [controller], "broker": [broker]}.get(roles, [broker, controller])
        self.settings = {
            "process.roles": roles,
            "node.id": str(node_id),
            "controller.quorum.voters": quorum.settings["controller.quorum.voters"]
            if quorum is not None
            else f"{node_id}@127.0.0.1:{self.controller_port}",
            "listeners": ",".join(listeners),
            **(
                {}
                if roles == "controller"
                else {"advertised.listeners": broker, "inter.broker.listener.name": "PLAINTEXT"}
            ),
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "metadata.log.dir": str(self.metadata_dir),
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.enable": str(cleaner_enable).lower(),
            "log.cleaner.backoff.ms": "500",
            "log.retention.check.interval.ms": "500",
            "log.initial.task.delay.ms": "500",
            "log.flush.offset.checkpoint.interval.ms": "500",
            "log.flush.start.offset.checkpoint.interval.ms": "500",
            "replica.high.watermark.checkpoint.interval.ms": "500",
            "num.partitions": "1",
            **(extra or {}),
        }
        self.root.mkdir(parents=True, exist_ok=True)
        if user is not None:
            os.chown(self.root, *user)
        self._write_config()
        self._format()

    def _write_config(self) -> None:
        self.config.write_text("".join(f"{k}={v}\n" for k, v in self.settings.items()))
        logging_file = self.root / ("log4j.properties" if self.line.startswith("3.") else "log4j2.properties")
        logging_file.write_text(_RELOAD4J if self.line.startswith("3.") else _LOG4J2)

    def _class_data(self, main: str) -> list[str]:
        """The JVM flags of the class-data archive: map it when it exists; else have this
        broker write it at its exit (``stop`` moves it into place after a clean exit only, so
        a killed JVM's half-written file is never used). Not for a broker run as another user
        (the archive is this user's)."""
        if self.user is not None:
            return []
        archive = class_archive(self.line)
        if archive.exists():
            return [f"-XX:SharedArchiveFile={archive}"]
        if main != "kafka.Kafka":
            return []
        self._archive_out = self.root / "classes.jsa"
        self._archive_out.unlink(missing_ok=True)
        return [f"-XX:ArchiveClassesAtExit={self._archive_out}"]

    def _keep_class_archive(self) -> None:
        """After a clean exit: the archive the JVM wrote becomes the line's (copied beside it
        and renamed: two workers may both write one; either is whole)."""
        out, self._archive_out = self._archive_out, None
        if out is None or not out.exists():
            return
        archive = class_archive(self.line)
        partial = archive.with_name(f"{archive.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        try:
            with contextlib.suppress(OSError):  # a full disk: the next broker writes one again
                shutil.copyfile(out, partial)
                os.replace(partial, archive)
        finally:
            partial.unlink(missing_ok=True)
            out.unlink(missing_ok=True)

    def _java(self, main: str, *args: str) -> list[str]:
        logging_file = self.root / ("log4j.properties" if self.line.startswith("3.") else "log4j2.properties")
        logging = (
            f"-Dlog4j.configuration=file:{logging_file}"
            if self.line.startswith("3.")
            else f"-Dlog4j2.configurationFile={logging_file}"
        )
        return [
            "java",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Xshare:auto",
            *self._class_data(main),
            logging,
            "-cp",
            f"{libs(self.line)}/*",
            main,
            *args,
        ]

    def _as_user(self) -> dict[str, object]:
        if self.user is None:
            return {}
        return {"user": self.user[0], "group": self.user[1], "extra_groups": [self.user[1]]}

    def _format_dirs(self) -> list[Path]:
        """The dirs ``kafka-storage format`` writes: every log dir, then the metadata dir."""
        dirs = [Path(d) for d in self.settings["log.dirs"].split(",")]
        metadata = Path(self.settings["metadata.log.dir"])
        return dirs if metadata in dirs else [*dirs, metadata]

    def _format_key(self, dirs: list[Path]) -> str | None:
        """What a format's files depend on, or None for a format that is never shared (a node
        joining another node's quorum takes its cluster id; another uid owns its files)."""
        if self.quorum_member or self.user is not None:
            return None
        per_broker = {"listeners", "advertised.listeners", "controller.quorum.voters", "log.dirs", "metadata.log.dir"}
        settings = sorted((k, v) for k, v in self.settings.items() if k not in per_broker)
        metadata = dirs.index(Path(self.settings["metadata.log.dir"]))
        return repr((self.line, len(dirs), metadata, settings))

    def _format(self) -> None:
        """``kafka-storage format``, or a copy of the files a format with the same settings
        wrote before in this process (a format is a JVM, about a second of CPU; its files
        differ from one format to the next only in the random cluster and directory ids)."""
        dirs = self._format_dirs()
        key = self._format_key(dirs)
        template = _FORMATTED.get(key) if key is not None else None
        if template is not None:
            for n, d in enumerate(dirs):
                shutil.copytree(template / str(n), d, dirs_exist_ok=True)
            self.cluster_id = (template / "cluster.id").read_text()
            return
        before = [set(os.listdir(d)) if d.is_dir() else set() for d in dirs]  # a test's own files stay out
        out = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(self.config)),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **self._as_user(),  # type: ignore[call-overload]
        )
        assert out.returncode == 0, out.stdout + out.stderr
        if key is not None:
            template = Path(tempfile.mkdtemp(prefix="kafka-format-"))
            atexit.register(shutil.rmtree, template, True)
            for n, d in enumerate(dirs):
                shutil.copytree(d, template / str(n), ignore=lambda where, names, d=d, n=n: (
                    before[n] & set(names) if Path(where) == d else set()))
            (template / "cluster.id").write_text(self.cluster_id)
            _FORMATTED[key] = template

    def run_tool(self, main: str, *args: str, check: bool = True) -> str:
        """One of Kafka's own command-line tools (``kafka.admin.ConfigCommand``, ...) from this
        line's jars, against the running broker when the arguments say so; its output (with
        ``check``, a non-zero exit fails the test)."""
        out = subprocess.run(self._java(main, *args), capture_output=True, text=True, timeout=120, check=False)
        assert not check or out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def reconfigure(self, **settings: str) -> None:
        """New broker settings, from the next start (the broker must be stopped)."""
        assert self.proc is None
        self.settings.update({k.replace("_", "."): v for k, v in settings.items()})
        self._write_config()

    # -- running ---------------------------------------------------------------------------
    def start(self, *, wait: bool = True, timeout_s: float = 90.0) -> RealBroker:
        assert self.proc is None, "already running"
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        log = open(self.log_file, "ab")  # noqa: SIM115 - the child writes it; closed at once here
        try:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(self.config)),
                stdout=log,
                stderr=subprocess.STDOUT,
                **self._as_user(),  # type: ignore[call-overload]
            )
        finally:
            log.close()
        if wait:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        self.wait_for_log("Kafka Server started", timeout_s)

    def wait_for_log(self, text: str, timeout_s: float = 90.0) -> None:
        """Until the log since the last start has ``text``; fails if the broker exits first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            if text in self.log_since_start():
                return
            time.sleep(0.1)
        raise AssertionError(f"the broker did not log {text!r} within {timeout_s} s:\n{self.log_tail()}")

    def exited(self, timeout_s: float) -> int | None:
        """The broker's exit code if it exits within ``timeout_s`` (a start that failed)."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self.proc = None
        return code

    def stop(self, *, kill: bool = False, timeout_s: float = 60.0) -> None:
        """SIGTERM (a clean shutdown) or SIGKILL; by pid, and always waited for."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"the broker did not stop within {timeout_s} s:\n{self.log_tail()}") from None
        if kill:
            self._archive_out = None
        else:
            self._keep_class_archive()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)

    # -- the log -----------------------------------------------------------------------------
    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def log_since_start(self) -> str:
        with open(self.log_file, "rb") as f:
            f.seek(getattr(self, "_log_offset", 0))
            return f.read().decode(errors="replace")

    def log_tail(self, n: int = 6000) -> str:
        return self.log_text()[-n:]

    def problems(self, words: Iterable[str]) -> list[str]:
        """ERROR/WARN lines of the log since the last start that mention any of ``words``."""
        return [
            line
            for line in self.log_since_start().splitlines()
            if ("ERROR" in line or "WARN" in line) and any(w in line for w in words)
        ]

    # -- clients -----------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=30_000)
        try:
            admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
        finally:
            admin.close()

    def produce(self, topic: str, records: Iterable[tuple[int, bytes, bytes | None]]) -> None:
        """(partition, key, value) records, acks=all, flushed."""
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5, batch_size=16_384)
        try:
            for partition, key, value in records:
                producer.send(topic, key=key, value=value, partition=partition)
            producer.flush(60)
        finally:
            producer.close(10)

    def consume(self, topic: str, partitions: int) -> dict[int, dict[bytes, bytes | None]]:
        """Per partition, every key's latest value (None: a tombstone) as a consumer reading
        from the earliest offset to the end sees it."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            ends = consumer.end_offsets(tps)
            out: dict[int, dict[bytes, bytes | None]] = {p: {} for p in range(partitions)}
            deadline = time.monotonic() + 60
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                assert time.monotonic() < deadline, "the consumer did not reach the end offsets"
                for tp, messages in consumer.poll(timeout_ms=500).items():
                    for m in messages:
                        out[tp.partition][m.key] = m.value
            return out
        finally:
            consumer.close()

    def partition_state(self, topic: str, partition: int = 0) -> dict:
        """Leader and ISR of a partition, as the cluster's metadata says (Admin API)."""
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=10_000)
        try:
            (described,) = admin.describe_topics([topic])
            # kafka-python names the index "partition_index" (3.x) or "partition" (older).
            state = next(
                p for p in described["partitions"] if p.get("partition_index", p.get("partition")) == partition
            )
            return {"leader": state["leader_id"], "isr": sorted(state["isr_nodes"])}
        finally:
            admin.close()

    def offsets(self, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
        """Per partition, (earliest, latest) offsets (ListOffsets)."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap)
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            first, last = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
            return {tp.partition: (first[tp], last[tp]) for tp in tps}
        finally:
            consumer.close()


@contextlib.contextmanager
def two_broker_cluster(
    root: Path, line: str, *, extra: dict[str, str] | None = None, cleaner_enable: bool = False
) -> Iterator[tuple[RealBroker, RealBroker, RealBroker]]:
    """A controller (node 0, fencing a silent broker after 3 s) and brokers 1 and 2 in its
    quorum, started and ready; every node is killed at the end (and resumed first, should a
    test have SIGSTOPped it)."""
    controller = RealBroker(
        root / "controller", line, node_id=0, roles="controller", extra={"broker.session.timeout.ms": "3000"}
    )
    one, two = (
        RealBroker(
            root / f"broker-{n}",
            line,
            node_id=n,
            roles="broker",
            quorum=controller,
            cleaner_enable=cleaner_enable,
            extra=extra,
        )
        for n in (1, 2)
    )
    try:
        controller.start(wait=False)
        one.start(wait=False)
        two.start()
        one.wait_ready()
        yield controller, one, two
    finally:
        for node in (two, one, controller):
            if node.proc is not None:
                os.kill(node.proc.pid, signal.SIGCONT)
            node.stop(kill=True)


def create_topic(
    broker: RealBroker, topic: str, assignment: dict[int, list[int]], configs: dict[str, str] | None = None
) -> None:
    """``topic`` with these replica assignments (partition -> brokers, the first the preferred
    leader) and topic configs, through the Admin API."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        admin.create_topics([NewTopic(topic, replica_assignments=assignment, topic_configs=configs or {})])
    finally:
        admin.close()


def partition_files(log_dir: Path, topic: str) -> dict[str, dict[str, int]]:
    """Per partition dir of ``topic``: its regular files and their sizes (what Kafka loads)."""
    out = {}
    for pdir in sorted(log_dir.glob(f"{topic}-*")):
        out[pdir.name] = {e.name: e.stat().st_size for e in os.scandir(pdir) if e.is_file()}
    return out


def wait_until(predicate, what: str, timeout_s: float = 120.0):  # type: ignore[no-untyped-def]
    """``predicate()``'s first truthy value, polled until ``timeout_s``; a broker between
    states answers with errors for a while, which count as not yet. Fails naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            if last := predicate():
                return last
        except Exception as e:
            last = e
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
