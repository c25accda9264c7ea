"""A log dir in S3-compatible object storage, as the Spark jobs read it.

A fleet's log dirs copied to a bucket (``s3://bucket/prefix/<log dir>/``: the root files and
``<topic>-<partition>/`` prefixes, as ``aws s3 sync`` or ``rclone copy`` lay them out) are
INPUTs of ``report`` and ``compact``. The driver only lists them: a listing gives every
partition, its objects and their sizes and ETags, which is the plan's identity - no object is
read on the driver but the log dir's small root files (checkpoints). Each task mirrors the
one partition it works on (the root files and that partition's objects) onto its executor's
local disk and runs the engine there, unchanged: the engine needs files it can ``mmap``,
``seek`` and open by name, which an object is not. (The driver mirrors a partition only in a
``report`` whose offset map would fill up: the map's cut is found with the engine there.)

``compact-large``'s driver plans a partition it must not download (issue 28: it reads
metadata only). Its mirror is *hollow*: every file but the ``.log`` files whole (indexes,
snapshots, checkpoints: small), and each ``.log`` a sparse file of the object's size holding
only what planning reads of it - its first entry (its header gives the max compaction lag),
its tail from its last offset index entry (``readNextOffset``), and what the producer state
is replayed over after its newest snapshot. Ranged GETs, checked against the listing as a
download is. Each piece is whole entries, from an entry's start (an index entry's position)
to the next's or the end, so every hole begins where an entry would: a reader walking the
entries into it reads zeros, an entry of length 0, which every reader of batches refuses
(``CorruptRecordError``), never a silent answer; :func:`in_hole` tells the driver that
such an error was its own mirror's.

A mirror is keyed by the listing it was made from, so two tasks on one host share it, an
object that changed since (another ETag or size) makes another mirror, and a download is
checked against the listing (the GET's ETag and length): a partition rewritten between the
listing and the download fails the task instead of mixing two states. Mirrors live under the
executor's Spark local directory (``SPARK_LOCAL_DIRS``, which Spark removes with the
executor), else in a temporary directory the process removes when it exits.

A segment's modification time matters to the cleaner (a segment without timestamps is
compacted or retained by it), and an object's ``Last-Modified`` is when it was uploaded:
the file's own time is taken from the object's ``mtime`` metadata (seconds since the epoch,
as ``rclone`` stores it; ``aws s3 cp --metadata mtime=...`` can set it) when present.

The endpoint, credentials and region are boto3's: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, a profile or an
instance role; executors need them too (``spark.executorEnv.*``).
"""

from __future__ import annotations

import atexit
import decimal
import fcntl
import functools
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cleaner.errors import KafkaCleanerError
from cleaner.records.batch import LOG_OVERHEAD
from cleaner.storage.lock import LOCK_FILE
from cleaner.storage.producer_state import list_snapshots
from cleaner.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    file_name,
    offset_from_file_name,
)
from cleaner.storage.topic_partition import parse_partition_dir

SCHEMES = ("s3://", "s3a://")
"""Both name the same store here: ``s3a://`` is how Hadoop (and so a Spark user) spells it."""

MTIME_METADATA = "mtime"
HOLLOW_STATE = ".kafka-cleaner-hollow.json"
MIRROR_DIR_NAME = "kafka-cleaner-mirror"


def is_object_uri(text: str | os.PathLike[str]) -> bool:
    return isinstance(text, str) and text.startswith(SCHEMES)


@dataclass(frozen=True)
class ObjectInfo:
    """An object of a log dir, by its name relative to the log dir ("t-0/00..0.log")."""

    name: str
    size: int
    etag: str


@dataclass(frozen=True)
class ObjectLogDir:
    """``s3://bucket/prefix``: a log dir's objects are ``prefix/<name>``."""

    uri: str
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> ObjectLogDir:
        scheme = next(s for s in SCHEMES if uri.startswith(s))
        bucket, _, prefix = uri[len(scheme):].partition("/")
        prefix = prefix.strip("/")
        if not bucket or not prefix:
            raise KafkaCleanerError(f"{uri}: an object-storage log dir is s3://<bucket>/<prefix> (a prefix of its own)")
        return cls(f"s3://{bucket}/{prefix}", bucket, prefix)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def overlaps(self, other: ObjectLogDir) -> bool:
        """Whether one holds the other (or both are the same prefix)."""
        a, b = self.prefix + "/", other.prefix + "/"
        return self.bucket == other.bucket and (a.startswith(b) or b.startswith(a))

    def listing(self, under: str = "", *, top_level: bool = False) -> list[ObjectInfo]:
        """Every object under the log dir (or under ``under``, a partition's "t-0/"; with
        ``top_level``, only those not in a "directory": the root files), sorted."""
        out = []
        start = self.key(under) if under else self.prefix + "/"
        args = {"Bucket": self.bucket, "Prefix": start, **({"Delimiter": "/"} if top_level else {})}
        pages = s3_client().get_paginator("list_objects_v2").paginate(**args)
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    name = item["Key"][len(self.prefix) + 1:]
                    out.append(ObjectInfo(name, int(item["Size"]), str(item["ETag"]).strip('"')))
        except Exception as e:  # botocore's ClientError, EndpointConnectionError, NoCredentialsError
            raise KafkaCleanerError(f"{self.uri}: cannot list the log dir: {e}") from e
        return sorted(out, key=lambda o: o.name)

    def layout(self) -> tuple[list[ObjectInfo], dict[str, list[ObjectInfo]]]:
        """(the root files, the objects of each partition directory by its name): one listing.
        Objects deeper than a partition's files, and prefixes that are no partition
        (``<topic>-<n>``: Kafka's own names, as ``LogDirectory`` reads a log dir), are not
        the log dir's."""
        root: list[ObjectInfo] = []
        partitions: dict[str, list[ObjectInfo]] = {}
        for o in self.listing():
            head, sep, rest = o.name.partition("/")
            if not sep:
                if head != LOCK_FILE:
                    root.append(o)
            elif "/" not in rest and parse_partition_dir(head) is not None:
                partitions.setdefault(head, []).append(o)
        if not root and not partitions:
            raise KafkaCleanerError(f"{self.uri}: no such log directory (no object under it)")
        return root, partitions


CLIENT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
              "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE")
"""The environment boto3 configures a client from: a client is made again when it changes."""


def s3_client() -> Any:
    """boto3's S3 client, configured by its environment (endpoint, credentials, region)."""
    return _client_for(tuple(os.environ.get(name) for name in CLIENT_ENV))


@functools.lru_cache(maxsize=4)
def _client_for(environment: tuple[str | None, ...]) -> Any:
    """One client per ``environment`` (the values of ``CLIENT_ENV``: only the cache's key;
    boto3 reads the variables itself)."""
    try:
        import boto3
    except ImportError as e:  # pragma: no cover - boto3 comes with the spark extra
        raise KafkaCleanerError("object storage needs boto3 (pip install 'kafka-cleaner[spark]')") from e
    return boto3.client("s3")


def mirror_base() -> Path:
    """Where this process keeps mirrors: under the executor's Spark local directory (Spark
    removes it with the executor), else (the driver) in a temporary directory of this
    process's own, removed when it exits."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return Path(local) / MIRROR_DIR_NAME if local else _private_base()


def scratch_base() -> Path:
    """Where a task makes the files it uploads (``cleaner.spark.object_output``): beside the
    mirrors, on the executor's local disk."""
    base = mirror_base()
    base.mkdir(parents=True, exist_ok=True)
    return base


@functools.cache
def _private_base() -> Path:
    path = Path(tempfile.mkdtemp(prefix=MIRROR_DIR_NAME + "-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def mirror(log_dir: ObjectLogDir, partition: str | None = None, *, base: Path | None = None,
           hollow: bool = False) -> Path:
    """A local log dir holding ``log_dir``'s root files and, with ``partition``, that
    partition's files (without: an empty directory for each partition, so that the log dir's
    layout reads as it is); made once per listing and shared by the tasks of a host
    (``base``: elsewhere than :func:`mirror_base`). ``hollow``: the partition's ``.log``
    files hold only what planning reads (see the module's docstring), unless this host has
    the whole mirror of the same listing already (a report's stage 0 made it)."""
    root = [o for o in log_dir.listing(top_level=True) if o.name != LOCK_FILE]
    if partition is not None:
        objects = root + [o for o in log_dir.listing(partition + "/") if "/" not in o.name[len(partition) + 1:]]
        if len(objects) == len(root):
            raise KafkaCleanerError(f"{log_dir.uri}/{partition}: no such partition")
        dirs = [partition]
    else:
        objects, dirs = root, sorted(log_dir.layout()[1])

    def made(hollowed: bool) -> Path:
        identity = json.dumps([log_dir.uri, [(o.name, o.size, o.etag) for o in objects], dirs, hollowed])
        return (base or mirror_base()) / hashlib.sha256(identity.encode()).hexdigest()[:24]

    final = made(hollow)
    for done in (final, made(False)):  # a whole mirror of the same listing serves a hollow one too
        if done.is_dir():
            return done
    work = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    try:
        logs = [o for o in objects if hollow and "/" in o.name and o.name.endswith(LOG_SUFFIX)]
        for o in objects:
            if o not in logs:
                download(log_dir, o, work / o.name)
        if logs:
            state = {"uri": log_dir.uri, "objects": {o.name: [o.size, o.etag] for o in logs},
                     "windows": _hollow_logs(log_dir, work, logs)}
            _hollow_state(work).write_text(json.dumps(state))
        for name in dirs:
            (work / name).mkdir(exist_ok=True)
        try:
            os.rename(work, final)
        except OSError:  # another task of this host made the same mirror first
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def download(log_dir: ObjectLogDir, o: ObjectInfo, path: Path) -> None:
    """One object to ``path``, checked against the listing; its mtime from the metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        got = _get(log_dir, o, f, 0, o.size)
    size = path.stat().st_size
    if size != o.size:
        raise KafkaCleanerError(f"{log_dir.uri}/{o.name}: the object changed since it was listed ({o.size} bytes "
                                f"listed, {size} bytes read): plan the job again")
    _set_mtime(path, got)


def _get(log_dir: ObjectLogDir, o: ObjectInfo, f: Any, start: int, end: int) -> Mapping[str, Any]:
    """Bytes [start, end) of the object written at the same position of ``f``; the answer's
    ETag must be the listing's (the object is still the one planned)."""
    args = {"Range": f"bytes={start}-{end - 1}"} if (start, end) != (0, o.size) else {}
    try:
        got = s3_client().get_object(Bucket=log_dir.bucket, Key=log_dir.key(o.name), **args)
        if end > start or not args:
            f.seek(start)
            shutil.copyfileobj(got["Body"], f, 8 << 20)
    except Exception as e:
        raise KafkaCleanerError(f"{log_dir.uri}/{o.name}: cannot read the object: {e}") from e
    etag = str(got.get("ETag", "")).strip('"')
    if etag != o.etag:
        raise KafkaCleanerError(f"{log_dir.uri}/{o.name}: the object changed since it was listed (ETag {o.etag} "
                                f"listed, {etag} read): plan the job again")
    return got


def _set_mtime(path: Path, got: Mapping[str, Any]) -> None:
    mtime_ns = _mtime_ns(got.get("Metadata") or {})
    if mtime_ns is None:
        mtime_ns = int(got["LastModified"].timestamp()) * 10**9
    os.utime(path, ns=(mtime_ns, mtime_ns))


def _hollow_logs(log_dir: ObjectLogDir, work: Path, logs: list[ObjectInfo]) -> dict[str, list[tuple[int, int]]]:
    """The ``.log`` files of a hollow mirror whose other files are in ``work`` already: each
    the object's size, with its head and the tail planning reads (the module's docstring).
    A segment without its indexes is whole: opening it rebuilds them from every batch.
    Returns the byte ranges each holds, by name."""
    windows: dict[str, list[tuple[int, int]]] = {}
    partition = work / logs[0].name.partition("/")[0]
    # Where the engine replays the producers from to the log end: the newest snapshot (an
    # older one if that is unusable: then planning reads a hole and says so).
    snapshots = list_snapshots(partition)
    replays = [snapshots[-1][0] if snapshots else -1]
    bases = sorted(offset_from_file_name(o.name.rpartition("/")[2]) for o in logs)
    next_base = dict(itertools.pairwise(bases))
    for o in logs:
        base = offset_from_file_name(o.name.rpartition("/")[2])
        has_indexes = all((partition / (o.name.rpartition("/")[2][: -len(LOG_SUFFIX)] + suffix)).exists()
                          for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX))
        segment = LogSegment(partition, base)
        tail = min(segment.lookup_position(2**63 - 1), max(o.size - 1, 0)) if has_indexes else 0
        for offset in replays:
            if offset < base:
                tail = 0
            elif base not in next_base or offset < next_base[base]:
                tail = min(tail, segment.lookup_position(offset))
        path = work / o.name
        with open(path, "w+b") as f:
            f.truncate(o.size)
            got = _get(log_dir, o, f, tail, o.size)
            head = tail
            if tail >= LOG_OVERHEAD:  # the first entry, whole: every hole then starts where an entry would
                _get(log_dir, o, f, 0, LOG_OVERHEAD)
                f.flush()
                length = int.from_bytes(os.pread(f.fileno(), LOG_OVERHEAD, 0)[8:], "big", signed=True)
                head = min(tail, LOG_OVERHEAD + max(length, 0))
                _get(log_dir, o, f, LOG_OVERHEAD, head)
            elif tail:
                _get(log_dir, o, f, 0, tail)
        _set_mtime(path, got)
        windows[o.name] = [(0, o.size)] if head >= tail else [(0, head), (tail, o.size)]
    return windows


def fill(partition_dir: Path, bases: Iterable[int]) -> None:
    """The segments ``bases`` of a hollow mirror's partition made whole: what a task reads
    record by record (a summary's headers, phase 1's keys, phase 2's rewrite, the driver's
    map cut). Each is downloaded beside the mirror and renamed over its hollow file, so a
    reader sees the one or the other, with the object's time either way; the tasks of an
    executor share the mirror and download a segment once. A mirror that is not hollow (or a
    partition on a file system) holds every segment already."""
    state_path = _hollow_state(partition_dir.parent)
    if not state_path.exists():
        return
    names = {f"{partition_dir.name}/{file_name(base, LOG_SUFFIX)}" for base in bases}
    with open(state_path.with_name(state_path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download of a segment per host
        state = json.loads(state_path.read_text())
        log_dir = ObjectLogDir.parse(state["uri"])
        for name in sorted(names & set(state["objects"])):
            size, etag = state["objects"][name]
            if state["windows"][name] == [[0, size]]:
                continue
            work = partition_dir.parent.parent / f".fill-{uuid.uuid4().hex[:12]}"
            try:
                download(log_dir, ObjectInfo(name, size, etag), work)
                os.rename(work, partition_dir.parent / name)
            finally:
                work.unlink(missing_ok=True)
            state["windows"][name] = [[0, size]]
            tmp = state_path.with_name(state_path.name + f".{uuid.uuid4().hex[:8]}")
            tmp.write_text(json.dumps(state))
            os.rename(tmp, state_path)  # whole at once for in_hole, which does not lock


def in_hole(path: str | os.PathLike[str], position: int) -> bool:
    """Whether ``position`` of a file of a hollow mirror is outside what it downloaded (the
    file system's own holes are whole blocks: the bytes downloaded are recorded instead)."""
    path = Path(path)
    try:
        state = json.loads(_hollow_state(path.parent.parent).read_text())
        windows = state["windows"][f"{path.parent.name}/{path.name}"]
    except (OSError, ValueError, KeyError):
        return False
    return not any(start <= position < end for start, end in windows)


def _hollow_state(mirror_root: Path) -> Path:
    """What a hollow mirror was made from and which bytes of each ``.log`` it holds: a root
    file of the mirror, which the engine does not read (it knows the root files by name), so
    that it appears with the mirror, in the same rename."""
    return mirror_root / HOLLOW_STATE


def _mtime_ns(metadata: Mapping[str, str]) -> int | None:
    """The ``mtime`` metadata ("seconds.fraction", as rclone writes it) in nanoseconds, exactly:
    a float holds a time of this century to ~0.2 microseconds only. Metadata names are HTTP
    headers, so any case (S3 answers in lower case, others capitalised)."""
    text = next((v for k, v in metadata.items() if k.lower() == MTIME_METADATA), None)
    try:
        return int(decimal.Decimal(text).scaleb(9)) if text is not None else None
    except decimal.InvalidOperation:
        return None


def mtime_text(mtime_ns: int) -> str:
    """A file's time as the ``mtime`` metadata holds it (rclone's form: seconds, a fraction)."""
    return f"{mtime_ns // 10**9}.{mtime_ns % 10**9:09d}"


def fingerprint(objects: list[ObjectInfo]) -> list[tuple[str, int, str]]:
    """The identity of a partition or of root files in a plan: names, sizes and ETags."""
    return [(o.name.rpartition("/")[2], o.size, o.etag) for o in objects]
