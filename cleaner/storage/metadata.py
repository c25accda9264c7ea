"""Log-dir and partition metadata files the cleaner reads but never changes.

- ``meta.properties`` (log-dir root): Java ``.properties``; v0 (ZooKeeper era) ``version=0``,
  ``broker.id``, optional ``cluster.id``; v1 (KRaft) ``version=1``, ``cluster.id``, ``node.id``,
  optional ``directory.id`` (Kafka ``MetaProperties.java``, ``PropertiesUtils.java``);
- ``partition.metadata`` (partition dir): ``version: 0\\ntopic_id: <base64url Uuid>``, no trailing
  newline (``PartitionMetadataFile.java``, ``PartitionMetadataReadBuffer.java``, ``PartitionMetadata.java``);
- ``leader-epoch-checkpoint`` (partition dir): CheckpointFile framing, lines ``epoch startOffset``
  (``LeaderEpochCheckpointFile.java``);
- ``.kafka_cleanshutdown`` (log-dir root): JSON ``{"version":0,"brokerEpoch":N}``, empty in older
  brokers (``CleanShutdownFileHandler.java``); only its presence matters to log loading (§3.4).

Writers for ``meta.properties`` and ``partition.metadata`` exist for the test-data generator;
they produce the bytes a broker writes, through ``files.atomic_write``.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from cleaner.errors import CorruptCheckpointError
from cleaner.storage import files
from cleaner.storage.checkpoint import parse_checkpoint, parse_int32, parse_int64, split_fields

PathLike = str | os.PathLike[str]

META_PROPERTIES = "meta.properties"
PARTITION_METADATA = "partition.metadata"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"

# ---------------------------------------------------------------------------------------
# Uuid (Kafka's org.apache.kafka.common.Uuid: 16 bytes, printed base64url without padding)

_B64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")


def decode_uuid(text: str) -> bytes:
    """``Uuid.fromString``: at most 24 characters of base64url (padding optional) decoding to
    exactly 16 bytes; else ValueError."""
    if len(text) > 24:
        raise ValueError(f"{text[:24]!r}... is too long to be decoded as a base64 UUID")
    if not _B64URL.fullmatch(text):
        raise ValueError(f"{text!r} is not base64url")
    stripped = text.rstrip("=")
    try:
        raw = base64.urlsafe_b64decode(stripped + "=" * (-len(stripped) % 4))
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"{text!r} is not base64url: {e}") from None
    if len(raw) != 16:
        raise ValueError(f"{text!r} decoded as {len(raw)} bytes, not the 16 bytes of a UUID")
    return raw


def encode_uuid(raw: bytes) -> str:
    """``Uuid.toString``: 22 characters of base64url, no padding."""
    if len(raw) != 16:
        raise ValueError("a Uuid has 16 bytes")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


# ---------------------------------------------------------------------------------------
# Java .properties


def _ends_with_continuation(line: str) -> bool:
    count = len(line) - len(line.rstrip("\\"))
    return count % 2 == 1


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        i += 1
        if ch != "\\" or i >= len(text):
            out.append(ch)
            continue
        ch = text[i]
        i += 1
        if ch == "u":
            digits = text[i : i + 4]
            if len(digits) < 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError("Malformed \\uxxxx encoding.")
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(ch, ch))
    return "".join(out)


def parse_java_properties(text: str) -> dict[str, str]:
    """``java.util.Properties.load`` over ``text``: ``#``/``!`` comments, blank lines, ``key=value``,
    ``key:value`` or ``key value``, backslash continuations and escapes. Raises ValueError on a
    malformed ``\\uxxxx`` escape (as Java does)."""
    props: dict[str, str] = {}
    natural = re.split(r"\r\n|\r|\n", text)
    i = 0
    while i < len(natural):
        line = natural[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while _ends_with_continuation(line):
            line = line[:-1]
            if i >= len(natural):
                break
            line += natural[i].lstrip(" \t\f")
            i += 1
        j, escaped = 0, False
        while j < len(line):
            ch = line[j]
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch in "=: \t\f":
                break
            j += 1
        key = line[:j]
        rest = line[j:]
        if rest and rest[0] in " \t\f":
            rest = rest.lstrip(" \t\f")
            if rest and rest[0] in "=:":
                rest = rest[1:]
        elif rest and rest[0] in "=:":
            rest = rest[1:]
        props[_unescape(key)] = _unescape(rest.lstrip(" \t\f"))
    return props


def _save_convert(text: str, escape_space: bool) -> str:
    """``Properties.saveConvert`` as used by ``store(Writer, ...)`` (no \\uxxxx escaping)."""
    out: list[str] = []
    for x, ch in enumerate(text):
        if 61 < ord(ch) < 127:
            out.append("\\\\" if ch == "\\" else ch)
        elif ch == " ":
            out.append("\\ " if x == 0 or escape_space else " ")
        elif ch in "\t\n\r\f":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[ch])
        elif ch in "=:#!":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _java_string_hash(text: str) -> int:
    h = 0
    units = text.encode("utf-16-be")
    for k in range(0, len(units), 2):
        h = (31 * h + ((units[k] << 8) | units[k + 1])) & 0xFFFFFFFF
    return h


PropertiesOrder = Literal["chm", "hashtable", "sorted"]


def java_properties_order(keys: list[str], order: PropertiesOrder) -> list[str]:
    """The order ``Properties.store`` writes keys inserted in ``keys`` order.

    - ``"chm"``: JDK 9-17, Properties backed by a ConcurrentHashMap(8) (16 bins): bins in
      index order, insertion order within a bin. What Kafka 3.x brokers on JDK 11/17 write
      (``node.id, directory.id, version, cluster.id``). Exact up to 11 keys (no resize).
    - ``"hashtable"``: JDK 8, a Hashtable(11): bins from the highest index down, newest
      first within a bin (Kafka 2.x: ``cluster.id, version, broker.id``). Exact up to 8 keys.
    - ``"sorted"``: JDK 18+ (JDK-8231640) writes keys in natural order.
    """
    if order == "sorted":
        return sorted(keys)
    if order == "chm":
        n = 16
        while len(keys) >= n - (n >> 2):
            n *= 2

        def chm_bin(k: str) -> int:
            h = _java_string_hash(k)
            return ((h ^ (h >> 16)) & 0x7FFFFFFF) & (n - 1)

        return [k for _, _, k in sorted((chm_bin(k), i, k) for i, k in enumerate(keys))]
    if order == "hashtable":
        cap = 11
        while len(keys) > int(cap * 0.75):
            cap = cap * 2 + 1
        return [
            k for _, _, k in sorted((-((_java_string_hash(k) & 0x7FFFFFFF) % cap), -i, k) for i, k in enumerate(keys))
        ]
    raise ValueError(f"unknown properties order {order!r}")


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def format_java_date(epoch_ms: int) -> str:
    """``java.util.Date.toString()`` in UTC: ``EEE MMM dd HH:mm:ss zzz yyyy`` (``Fri Jan 30 16:43:51 UTC 2026``)."""
    t = _dt.datetime.fromtimestamp(epoch_ms / 1000, tz=_dt.UTC)
    return f"{_DAYS[t.weekday()]} {_MONTHS[t.month - 1]} {t.day:02d} {t:%H:%M:%S} UTC {t.year}"


def format_java_properties(props: Mapping[str, str], *, date_text: str, order: PropertiesOrder = "chm") -> bytes:
    """The bytes of ``props.store(printWriter, "")`` as ``PropertiesUtils.writePropertiesFile`` does
    it: ``#`` (the empty comment), ``#<date>``, then ``key=value`` lines, ``\\n`` line ends, UTF-8."""
    lines = ["#", "#" + date_text]
    for key in java_properties_order(list(props), order):
        lines.append(f"{_save_convert(key, True)}={_save_convert(props[key], False)}")
    return ("\n".join(lines) + "\n").encode("utf-8")


# ---------------------------------------------------------------------------------------
# meta.properties


@dataclass(frozen=True)
class MetaProperties:
    """A log dir's ``meta.properties``. ``node_id`` is ``broker.id`` in v0 and ``node.id`` in v1;
    ``properties`` keeps every key read (including ones Kafka ignores)."""

    version: int
    cluster_id: str | None = None
    node_id: int | None = None
    directory_id: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def broker_id(self) -> int | None:
        return self.node_id

    def to_properties(self) -> dict[str, str]:
        """``MetaProperties.toProperties``, in its insertion order."""
        props = {"version": str(self.version)}
        if self.cluster_id is not None:
            props["cluster.id"] = self.cluster_id
        if self.version == 0:
            if self.node_id is not None:
                props["broker.id"] = str(self.node_id)
        else:
            if self.node_id is None:
                raise ValueError("node.id is required in meta.properties v1")
            props["node.id"] = str(self.node_id)
        if self.directory_id is not None:
            props["directory.id"] = self.directory_id
        return props


def parse_meta_properties(data: bytes, *, path: PathLike | None = None) -> MetaProperties:
    """Parse ``meta.properties`` with ``MetaProperties.Builder(Properties)``'s rules: version
    defaults to 0 and must be 0 or 1; v0 ``broker.id`` optional but numeric; v1 needs
    ``node.id`` and ``cluster.id``; ``directory.id`` must be a Uuid when present. The bytes
    are decoded as ISO-8859-1, as ``Properties.load(InputStream)`` does."""

    def bad(reason: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(reason, path=path)

    try:
        props = parse_java_properties(data.decode("latin-1"))
    except ValueError as e:
        raise bad(str(e)) from None
    version_text = props.get("version", "0")
    if version_text not in ("0", "1"):
        raise bad(f"Unknown meta.properties version number {version_text!r}")
    version = int(version_text)
    id_key = "broker.id" if version == 0 else "node.id"
    node_id = None
    if id_key in props:
        try:
            node_id = parse_int32(props[id_key], id_key)
        except ValueError:
            raise bad(f"Unable to read {id_key} as a base-10 number: {props[id_key]!r}") from None
    elif version == 1:
        raise bad("Failed to find node.id")
    cluster_id = props.get("cluster.id")
    if version == 1 and cluster_id is None:
        raise bad("cluster.id was not found.")
    directory_id = props.get("directory.id")
    if directory_id is not None:
        try:
            decode_uuid(directory_id)
        except ValueError as e:
            raise bad(f"Unable to read directory.id as a Uuid: {e}") from None
    return MetaProperties(version, cluster_id, node_id, directory_id, props)


def read_meta_properties(path: PathLike) -> MetaProperties:
    """Read ``path``; a directory means ``<dir>/meta.properties``."""
    if os.path.isdir(path):
        path = os.path.join(path, META_PROPERTIES)
    with open(path, "rb") as f:
        return parse_meta_properties(f.read(), path=path)


def format_meta_properties(
    meta: MetaProperties,
    *,
    now_ms: int | None = None,
    date_text: str | None = None,
    order: PropertiesOrder = "chm",
) -> bytes:
    """The bytes a broker writes for ``meta``. The ``#<date>`` comment line is
    ``format_java_date(now_ms)`` (UTC) unless ``date_text`` gives it verbatim; one is required."""
    if date_text is None:
        if now_ms is None:
            raise ValueError("give now_ms or date_text for the #<date> comment line")
        date_text = format_java_date(now_ms)
    return format_java_properties(meta.to_properties(), date_text=date_text, order=order)


def write_meta_properties(
    path: PathLike,
    meta: MetaProperties,
    *,
    now_ms: int | None = None,
    date_text: str | None = None,
    order: PropertiesOrder = "chm",
) -> None:
    """Write ``meta.properties`` (``path`` is the file, or a log dir) via tmp + fsync + rename."""
    if os.path.isdir(path):
        path = os.path.join(path, META_PROPERTIES)
    files.atomic_write(path, format_meta_properties(meta, now_ms=now_ms, date_text=date_text, order=order))


# ---------------------------------------------------------------------------------------
# partition.metadata

_PM_SEPARATOR = re.compile(r":[ \t\n\x0b\f\r]+")


@dataclass(frozen=True)
class PartitionMetadata:
    version: int
    topic_id: str  # base64url, as Kafka prints a Uuid

    @property
    def topic_id_bytes(self) -> bytes:
        return decode_uuid(self.topic_id)

    def encode(self) -> bytes:
        """``PartitionMetadata.encode``: ``version: V\\ntopic_id: ID``, no trailing newline."""
        return f"version: {self.version}\ntopic_id: {self.topic_id}".encode()


def parse_partition_metadata(data: bytes, *, path: PathLike | None = None) -> PartitionMetadata:
    """``PartitionMetadataReadBuffer.read``: ``key: value`` lines (split on ``:\\s+``), version >= 0
    (higher versions are accepted for downgrade compatibility), a valid non-zero topic id.
    Lines after the second are ignored, as Kafka ignores them."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptCheckpointError(f"not valid UTF-8 ({e.reason})", path=path, position=e.start) from None
    lines = re.split(r"\r\n|\r|\n", text)

    def field_of(n: int, key: str) -> str:
        if n >= len(lines) or (n == len(lines) - 1 and lines[n] == "" and n > 0):
            raise CorruptCheckpointError(f"line {n + 1}: missing {key!r} line", path=path)
        parts = _PM_SEPARATOR.split(lines[n], maxsplit=1)
        if len(parts) != 2 or parts[0] != key:
            raise CorruptCheckpointError(f"line {n + 1}: malformed line {lines[n]!r}", path=path)
        return parts[1]

    version_text = field_of(0, "version")
    try:
        version = parse_int32(version_text, "version")
    except ValueError:
        raise CorruptCheckpointError(f"line 1: malformed line {lines[0]!r}", path=path) from None
    if version < 0:
        raise CorruptCheckpointError(f"Unrecognized version of partition metadata file: {version}", path=path)
    topic_id = field_of(1, "topic_id")
    try:
        raw = decode_uuid(topic_id)
    except ValueError as e:
        raise CorruptCheckpointError(f"line 2: malformed line {lines[1]!r}: {e}", path=path) from None
    if raw == bytes(16):
        raise CorruptCheckpointError("Invalid topic ID in partition metadata file (the zero Uuid)", path=path)
    return PartitionMetadata(version, topic_id)


def read_partition_metadata(path: PathLike) -> PartitionMetadata:
    """Read ``path``; a directory means ``<dir>/partition.metadata``."""
    if os.path.isdir(path):
        path = os.path.join(path, PARTITION_METADATA)
    with open(path, "rb") as f:
        return parse_partition_metadata(f.read(), path=path)


def write_partition_metadata(path: PathLike, topic_id: str | bytes, *, version: int = 0) -> None:
    """Write ``partition.metadata`` as ``PartitionMetadataFile.maybeFlush`` does (tmp, fsync,
    atomic rename, directory fsync). ``path`` is the file or the partition dir."""
    text_id = encode_uuid(topic_id) if isinstance(topic_id, bytes) else topic_id
    if decode_uuid(text_id) == bytes(16):
        raise ValueError("the zero Uuid is not a valid topic id")
    if os.path.isdir(path):
        path = os.path.join(path, PARTITION_METADATA)
    files.atomic_write(path, PartitionMetadata(version, text_id).encode())


# ---------------------------------------------------------------------------------------
# leader-epoch-checkpoint


@dataclass(frozen=True)
class EpochEntry:
    epoch: int
    start_offset: int


def _parse_epoch_entry(line: str) -> EpochEntry | None:
    parts = split_fields(line)
    if len(parts) != 2:
        return None
    return EpochEntry(parse_int32(parts[0], "epoch"), parse_int64(parts[1], "start offset"))


def parse_leader_epoch_checkpoint(data: bytes, *, path: PathLike | None = None) -> list[EpochEntry]:
    """Entries in file order. Kafka writes them ascending; its reader does not check that (the
    ``LeaderEpochFileCache`` fixes up non-monotonic entries when it assigns them), so neither
    do we."""
    return parse_checkpoint(data, version=0, parse_entry=_parse_epoch_entry, path=path)


def read_leader_epoch_checkpoint(path: PathLike) -> list[EpochEntry]:
    """Read ``path`` (a partition dir means its ``leader-epoch-checkpoint``); missing means no entries."""
    if os.path.isdir(path):
        path = os.path.join(path, LEADER_EPOCH_CHECKPOINT)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return parse_leader_epoch_checkpoint(data, path=path)


# ---------------------------------------------------------------------------------------
# .kafka_cleanshutdown


@dataclass(frozen=True)
class CleanShutdown:
    """The clean-shutdown marker of a log dir. ``broker_epoch`` is None when the file is empty
    (brokers before KIP-966) or unreadable: ``CleanShutdownFileHandler.read`` then returns
    empty, but the file's presence still means "clean shutdown" to the log loader."""

    path: str
    broker_epoch: int | None


def read_clean_shutdown(log_dir: PathLike) -> CleanShutdown | None:
    """None if ``<log_dir>/.kafka_cleanshutdown`` is absent, else what it says."""
    path = os.path.join(log_dir, CLEAN_SHUTDOWN_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    # Kafka's CleanShutdownFileHandler writes {"broker_epoch":"N","version":"0"} (string
    # values); older notes describe {"brokerEpoch": N}. Presence is what matters to the
    # loader, so any content (even none, from older brokers) is accepted.
    epoch: int | None = None
    try:
        content = json.loads(data.decode("utf-8"))
        value = None
        if isinstance(content, dict):
            value = content.get("broker_epoch", content.get("brokerEpoch"))
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            epoch = value
    except (UnicodeDecodeError, ValueError):
        epoch = None
    return CleanShutdown(path, epoch)
