"""Helpers of the sidecar tests: policy files (also mounted like a ConfigMap), a simulated
broker that appends, rolls, truncates, applies retention and holds the log dir's ``.lock``
from another process (``broker_lock``), the sidecar driven by a ``MockTime``, and the real command line.

Imported as ``sidecar_helpers`` (``tests/sidecar`` is on ``sys.path`` like ``tests/``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cleaner.clock import MockTime
from cleaner.records.builder import build_batch
from cleaner.records.record import Record
from cleaner.sidecar.service import Sidecar, SidecarOptions
from cleaner.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.topic_partition import TopicPartition, parse_partition_dir

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "docs" / "sidecar-status-v1.schema.json"
KAFKA_CLEANER = Path(sys.executable).with_name("kafka-cleaner")
NOW_MS = 1_700_000_000_000
"""The generator's clock: generated records end here; the sidecars' MockTime starts here."""
SCAN_MS = 30_000
"""The scan interval of the in-process sidecars (the policy's default reportingSeconds)."""
SMALL_CLEANER = {"dedupeBufferSize": 4 * 1024 * 1024, "backoffMs": 1_000}
NO_DISK_FLOOR = {"minFreeDiskRatio": 0.0}
"""``stage`` unless a test says otherwise: the free space of the machine running the tests is
not the test's (a CI volume with less than the default 20% free refused every staged set); the
guard's own tests set the ratio, and fake the disk where its size matters."""
ALWAYS = {"windows": ["* * * ? * *"]}
"""``compact``: a maintenance window that never closes (a sidecar next to a broker that is
stopped and started by hand, or an offline volume)."""
"""Cleaner settings that keep a test fast (Kafka's 128 MiB offset map takes a second to allocate)."""


# -- policies ---------------------------------------------------------------------------------


def policy_manifest(
    mode: str = "observe",
    generation: int | None = 1,
    *,
    topics: list[dict[str, Any]] | None = None,
    cleaner: dict[str, Any] | None = None,
    stage: dict[str, Any] | None = None,
    compact: dict[str, Any] | None = None,
    reporting: dict[str, Any] | None = None,
    paused: bool = False,
) -> dict[str, Any]:
    """A CompactionPolicy manifest as the operator writes it into the ConfigMap."""
    spec: dict[str, Any] = {
        "mode": mode,
        "topics": topics if topics is not None else [{"match": "topic-.*", "cleanupPolicy": "compact"}],
        "cleaner": {**SMALL_CLEANER, **(cleaner or {})},
    }
    spec["stage"] = {**NO_DISK_FLOOR, **(stage or {})}
    if compact is not None:
        spec["compact"] = compact
    if reporting is not None:
        spec["reporting"] = reporting
    if paused:
        spec["paused"] = True
    metadata: dict[str, Any] = {"name": "orders-policy", "namespace": "kafka"}
    if generation is not None:
        metadata["generation"] = generation
    return {"apiVersion": "kafkacleaner.io/v1alpha1", "kind": "CompactionPolicy", "metadata": metadata, "spec": spec}


def write_policy(path: Path, **kwargs: Any) -> Path:
    """Write the policy file atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(policy_manifest(**kwargs), sort_keys=False))
    os.replace(tmp, path)
    return path


class ConfigMapMount:
    """A directory laid out like a kubelet's ConfigMap volume: ``policy.yaml`` is a symlink
    to ``..data/policy.yaml`` and ``..data`` a symlink to a timestamped directory; an update
    writes a new timestamped directory and renames a new ``..data`` symlink over the old one
    (the policy file's own inode and mtime say nothing)."""

    def __init__(self, root: Path, **kwargs: Any) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.version = 0
        self.update(**kwargs)
        (root / "policy.yaml").symlink_to("..data/policy.yaml")

    @property
    def path(self) -> Path:
        return self.root / "policy.yaml"

    def update(self, **kwargs: Any) -> None:
        self.version += 1
        new = self.root / f"..2024_01_01_00_00_{self.version:02d}.{random.randrange(10**9)}"
        new.mkdir()
        (new / "policy.yaml").write_text(yaml.safe_dump(policy_manifest(**kwargs), sort_keys=False))
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(new.name)
        os.replace(tmp, data)
        if old is not None:
            for f in (self.root / old).iterdir():
                f.unlink()
            (self.root / old).rmdir()


# -- the sidecar under a mock clock ----------------------------------------------------------


def new_sidecar(
    policy: Path, log_dirs: Iterable[str | Path], clock: MockTime | None = None, *, scan_ms: int = SCAN_MS
) -> Sidecar:
    return Sidecar(
        # A free loopback port: the default 9410 would collide between parallel tests.
        SidecarOptions(
            policy, [str(d) for d in log_dirs], broker_name="kafka-0", scan_interval_ms=scan_ms, listen=("127.0.0.1", 0)
        ),
        clock or MockTime(NOW_MS),
    )


def next_scan(sc: Sidecar, ms: int = SCAN_MS) -> dict[str, Any]:
    """Move the clock to the next scan, run one tick, return the validated /status."""
    assert isinstance(sc.time, MockTime)
    sc.time.advance(ms)
    sc.tick()
    return status_of(sc)


def scan_until(sc: Sidecar, happened: Callable[[], object], most: int, what: str) -> dict[str, Any]:
    """Scans until ``happened()`` (at most ``most``: a bound on the clock's scans, not a wait);
    the /status of the scan that saw it."""
    for _ in range(most):
        doc = next_scan(sc)
        if happened():
            return doc
    raise AssertionError(f"{what} in {most} scans")


def finish_pass(sc: Sidecar, timeout_s: float = 60.0) -> None:
    """Compact mode: wait until the running pass's threads are done (they exit when idle),
    then tick so that the sidecar ends the pass (locks released) and scans."""
    pool = getattr(sc._controller, "pool", None)
    if pool is not None:
        for t in pool.threads:
            t.join(timeout_s)
            assert not t.is_alive(), "the cleaner pass did not finish"
    sc.tick()


#: Read at import: a test that forks a child running as another uid must not have the child
#: read it from a checkout that uid cannot enter (a 0700 temporary clone).
_SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())


def validate_status(doc: dict[str, Any]) -> dict[str, Any]:
    jsonschema.validate(doc, _SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return doc


def status_of(sc: Sidecar) -> dict[str, Any]:
    """The /status document exactly as served (JSON round trip), validated."""
    return validate_status(json.loads(json.dumps(sc.status_document(), separators=(",", ":"))))


def topic_entry(doc: dict[str, Any], topic: str) -> dict[str, Any]:
    return next(t for t in doc["topics"] if t["topic"] == topic)


def partition_entry(doc: dict[str, Any], tp: str) -> dict[str, Any] | None:
    return next((p for p in doc["partitions"] if f"{p['topic']}-{p['partition']}" == tp), None)




# -- a simulated broker ------------------------------------------------------------------------


class SimBroker:
    """Plays the broker on one log dir: appends to the active segments (offsets continue
    from the log end offset), rolls, truncates, deletes segments by retention, and keeps
    ``replication-offset-checkpoint`` (high watermark = log end offset unless told) and
    ``log-start-offset-checkpoint`` up to date, as a broker's checkpoint threads do (with
    Kafka's rule for the latter: no entry after ordinary retention).

    The logs are opened once, writable, like a running broker's: a broker does not look
    at ``.swap`` files while it runs, only at its next start."""

    def __init__(self, log_dir: Path, *, seed: int = 0, segment_bytes: int = 1 << 30, keys: int = 200) -> None:
        self.log_dir = Path(log_dir)
        self.rng = random.Random(seed)
        self.keys = keys
        self.segment_bytes = segment_bytes
        self.logs: dict[TopicPartition, Log] = {}
        self.start()
        self.high_watermarks: dict[TopicPartition, int] = {}
        self.lock = threading.Lock()
        self.appended_bytes = 0

    def tp(self, name: str) -> TopicPartition:
        tp = parse_partition_dir(name)
        assert tp is not None
        return tp

    def partition_dir(self, tp: TopicPartition) -> Path:
        return self.log_dir / tp.dir_name

    def append(
        self, tp: TopicPartition, n: int = 10, *, tombstones: int = 0, timestamp: int | None = None, **batch: Any
    ) -> bytes:
        """One batch of ``n`` records (the last ``tombstones`` of them tombstones of keys
        that exist); returns the batch's bytes."""
        with self.lock:
            log = self.logs[tp]
            base = log.log_end_offset
            ts = NOW_MS + base if timestamp is None else timestamp
            records = []
            for i in range(n):
                key = b"key-%04d" % self.rng.randrange(self.keys)
                value = None if i >= n - tombstones else b"v-%d-%s" % (base + i, b"x" * self.rng.randrange(40))
                records.append(Record(base + i, ts + i, key, value))
            data = build_batch(records, **batch)
            log.append(data)
            self.appended_bytes += len(data)
            self._checkpoint()
            return data

    def roll(self, tp: TopicPartition) -> None:
        with self.lock:
            self.logs[tp].roll()

    def truncate(self, tp: TopicPartition, offset: int) -> None:
        """A follower truncating to ``offset`` after a leader change."""
        with self.lock:
            self.logs[tp].truncate_to(offset)
            self._checkpoint()

    def retention(self, tp: TopicPartition, segments: int = 1) -> list[str]:
        """Delete the oldest ``segments`` closed segments; returns their .log names."""
        with self.lock:
            log = self.logs[tp]
            doomed = log.segments[:segments]
            assert log.active_segment not in doomed
            log.delete_segments(doomed)
            self._checkpoint()
            return [s.log_path.name for s in doomed]

    def set_high_watermark(self, tp: TopicPartition, offset: int | None) -> None:
        with self.lock:
            if offset is None:
                self.high_watermarks.pop(tp, None)
            else:
                self.high_watermarks[tp] = offset
            self._checkpoint()

    def log_end_offset(self, tp: TopicPartition) -> int:
        return self.logs[tp].log_end_offset

    def _checkpoint(self) -> None:
        hw = {tp: self.high_watermarks.get(tp, log.log_end_offset) for tp, log in self.logs.items()}
        OffsetCheckpointFile(self.log_dir / REPLICATION_OFFSET_CHECKPOINT).write(hw)
        # Kafka's checkpointLogStartOffsetsInDir (3.9 and 4.x): an entry only for a log whose
        # start is above its first segment (DeleteRecords) or with remote storage. Ordinary
        # retention deletes whole segments and writes no entry.
        starts = {
            tp: log.log_start_offset
            for tp, log in self.logs.items()
            if log.segments and log.log_start_offset > log.segments[0].base_offset
        }
        OffsetCheckpointFile(self.log_dir / LOG_START_OFFSET_CHECKPOINT).write(starts)

    def start(self) -> None:
        """Open every partition as a broker's start-up does (completing swaps, removing
        ``.cleaned`` files: KAFKA_NOTES §4)."""
        self.logs = {}
        for entry in sorted(self.log_dir.iterdir()):
            tp = parse_partition_dir(entry.name) if entry.is_dir() else None
            if tp is not None:
                self.logs[tp] = Log.open(entry, LogConfig(segment_bytes=self.segment_bytes))

    def close(self) -> None:
        """Shut down (the broker's clean shutdown closes every log)."""
        for log in self.logs.values():
            log.close()


# -- processes, ports, HTTP --------------------------------------------------------------------


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes, str]:
    """(status, body, content type); HTTP errors are answers too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


_LISTENING = re.compile(r"listening on (\S+):(\d+)")


class SidecarProcess:
    """``kafka-cleaner sidecar`` as the operator runs it, on a free loopback port."""

    def __init__(
        self,
        policy: Path,
        log_dirs: Iterable[str | Path],
        *extra: str,
        log_file: Path,
        user: int | None = None,
        group: int | None = None,
    ) -> None:
        args = [str(KAFKA_CLEANER), "sidecar", "--policy", str(policy), "--listen", "127.0.0.1:0"]
        for d in log_dirs:
            args += ["--log-dir", str(d)]
        args += ["--broker-name", "kafka-0", *extra]
        self.log_file = log_file
        self._log = open(log_file, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            user=user,
            group=group,
            extra_groups=[] if user is not None else None,
        )
        self.port = self._wait_for_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def _wait_for_port(self, timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = _LISTENING.search(self.log_file.read_text())
            if m:
                return int(m.group(2))
            if self.proc.poll() is not None:
                raise AssertionError(f"the sidecar exited with {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.05)
        raise AssertionError(f"the sidecar did not start listening:\n{self.output()}")

    def output(self) -> str:
        return self.log_file.read_text()[-5000:]

    def get(self, path: str) -> tuple[int, bytes, str]:
        return http_get(self.url + path)

    def status(self) -> dict[str, Any]:
        code, body, _ = self.get("/status")
        assert code == 200, body
        return validate_status(json.loads(body))

    def wait_for(self, predicate, timeout_s: float = 30.0, what: str = "a condition") -> dict[str, Any]:
        """Poll /status until ``predicate(doc)``; returns that document."""
        deadline = time.monotonic() + timeout_s
        doc: dict[str, Any] = {}
        while time.monotonic() < deadline:
            code, body, _ = self.get("/status")
            if code == 200:
                doc = json.loads(body)
                if predicate(doc):
                    return validate_status(doc)
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last /status: {json.dumps(doc)[:2000]}\n{self.output()}")

    def terminate(self, timeout_s: float = 10.0) -> tuple[int, float]:
        """SIGTERM; returns (exit code, seconds it took)."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"the sidecar did not exit within {timeout_s} s of SIGTERM:\n{self.output()}"
            ) from None
        return code, time.monotonic() - started

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def sidecar_process(
    policy: Path,
    log_dirs: Iterable[str | Path],
    *extra: str,
    log_file: Path,
    user: int | None = None,
    group: int | None = None,
) -> Iterator[SidecarProcess]:
    proc = SidecarProcess(policy, log_dirs, *extra, log_file=log_file, user=user, group=group)
    try:
        yield proc
    finally:
        proc.stop()


# -- what /status should say, computed from the files ------------------------------------------


def expected_picture(log_dir: Path) -> dict[str, dict[str, Any]]:
    """Per partition, from a full read of the directory (no cache, no sidecar code): the
    records and tombstones on disk, and Kafka's clean/cleanable split for a log without
    open transactions whose high watermark is its log end offset: the first dirty offset is
    ``cleaner-offset-checkpoint`` (or the log start offset), the first uncleanable one the
    active segment's base."""
    from kafka_logs import read_records

    from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT

    log_dir = Path(log_dir)
    cleaned = OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).read()
    starts = OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).read()
    out = {}
    for entry in sorted(log_dir.iterdir()):
        tp = parse_partition_dir(entry.name) if entry.is_dir() else None
        if tp is None:
            continue
        log = Log.open(entry, read_only=True, log_start_offset=starts.get(tp))
        try:
            records = read_records(log)
            segments = log.segments
            active = segments[-1]
            first_dirty = cleaned.get(tp, log.log_start_offset)
            if not log.log_start_offset <= first_dirty <= log.log_end_offset:
                first_dirty = log.log_start_offset
            floor = max(s.base_offset for s in segments if s.base_offset <= first_dirty)
            clean = sum(s.size for s in segments if s.base_offset < first_dirty)
            cleanable = sum(s.size for s in segments if floor <= s.base_offset < active.base_offset)
            out[str(tp)] = {
                "topic": tp.topic,
                "records": len(records),
                "tombstones": sum(1 for r in records if r.value is None),
                "size": sum(s.size for s in segments),
                "clean": clean,
                "cleanable": cleanable,
                "ratio": cleanable / (clean + cleanable) if clean + cleanable else 0.0,
                "log_end_offset": log.log_end_offset,
            }
        finally:
            log.close()
    return out


def assert_status_matches(sc: Sidecar, doc: dict[str, Any], log_dir: Path) -> dict[str, dict[str, Any]]:
    """/status (topics, partitions, maxDirtyRatio) and the scan's record counts equal what
    ``expected_picture`` computes from the files."""
    want = expected_picture(log_dir)
    assert sc.snapshot is not None
    got = {str(s.report.topic_partition): s for s in sc.snapshot.statuses}
    assert set(got) == set(want)
    for tp, w in want.items():
        s = got[tp]
        assert s.facts is not None, tp
        assert (s.facts.records, s.facts.tombstones) == (w["records"], w["tombstones"]), tp
        assert (s.report.clean_bytes, s.report.cleanable_bytes) == (w["clean"], w["cleanable"]), tp
        assert s.report.size_bytes == w["size"], tp
        p = partition_entry(doc, tp)
        if p is not None:
            assert p["cleanableBytes"] == w["cleanable"] and abs(p["cleanableRatio"] - w["ratio"]) < 1e-5, tp
    for topic in {w["topic"] for w in want.values()}:
        mine = [w for w in want.values() if w["topic"] == topic]
        t = topic_entry(doc, topic)
        assert t["partitions"] == len(mine)
        assert t["cleanableBytes"] == sum(w["cleanable"] for w in mine)
        assert t["cleanBytes"] == sum(w["clean"] for w in mine)
        assert t["dirtyBytes"] == sum(w["size"] - w["clean"] for w in mine)
        assert t["tombstones"] == sum(w["tombstones"] for w in mine)
        assert abs(t["maxDirtyRatio"] - max(w["ratio"] for w in mine)) < 1e-5
    assert abs(doc["cleaner"]["maxDirtyRatio"] - max(w["ratio"] for w in want.values())) < 1e-5
    return want
