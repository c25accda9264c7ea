"""The cluster's topic configs, read from the KRaft metadata log on the broker's own disk.

A KRaft broker keeps the whole cluster metadata in ``__cluster_metadata-0`` (in its
``metadata.log.dir``, by default the first of ``log.dirs``): snapshots named
``<end offset>-<epoch>.checkpoint`` and an ordinary log of record batches. Each record's
value is a metadata record (``MetadataRecordSerde``): an unsigned varint frame version
(1), an unsigned varint API key, an unsigned varint record version, then the message in
Kafka's flexible (compact, tagged-field) encoding. Three of them carry topic configs:

- ``TopicRecord`` (API key 2): a topic's name and id;
- ``RemoveTopicRecord`` (9): the topic with that id is gone, and its configs with it;
- ``ConfigRecord`` (4): one key of one resource; ``Value`` null deletes the key.
  ``ResourceType`` 2 is a topic, 4 a broker: ``ResourceName`` "" is the cluster-wide
  dynamic default, a broker id that broker's own dynamic config.

Metadata transactions (KIP-868: ``BeginTransactionRecord`` 23, ``EndTransactionRecord``
24, ``AbortTransactionRecord`` 25) are applied only once ended, and dropped when aborted,
as the controller's ``MetadataLoader`` does. Everything is read without writing, locking
or keeping files open; memory is the configs themselves plus one read buffer.

It also keeps each partition's replication as the controller recorded it (replicas, ISR,
leader: ``PartitionRecord`` 3, ``PartitionChangeRecord`` 5) and which brokers are fenced
(``RegisterBrokerRecord`` 0, ``UnregisterBrokerRecord`` 1, ``FenceBrokerRecord`` 7,
``UnfenceBrokerRecord`` 8, ``BrokerRegistrationChangeRecord`` 17), each with the time of the
metadata batch that made it so: what the replication race check needs (issue 24, item 2:
a replica out of the ISR longer than a tombstone's delete horizon never sees it). The times
are approximations: the batch's timestamp is when the controller appended the change (the
fetch that went missing began up to ``replica.lag.time.max.ms`` earlier), and a state first
read from a snapshot is dated by the snapshot's batch (it held since *at least* then).
Memory: a few tuples of broker ids per partition of the cluster.

What the disk cannot say: a broker's static ``server.properties``. Keys set there
(``log.cleaner.delete.retention.ms=...`` in the file) are invisible here, which is why
``TopicConfigs.source`` tells a topic override from a dynamic cluster default.
"""

from __future__ import annotations

import os
import re
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cleaner.errors import CorruptDataError, CorruptRecordError
from cleaner.records.columns import decode_records
from cleaner.records.varint import decode_unsigned_varint
from cleaner.storage.segment import iter_file_batches
from cleaner.storage.topic_partition import METADATA_TOPIC

METADATA_PARTITION_DIR = f"{METADATA_TOPIC}-0"

REGISTER_BROKER_RECORD = 0
UNREGISTER_BROKER_RECORD = 1
TOPIC_RECORD = 2
PARTITION_RECORD = 3
CONFIG_RECORD = 4
PARTITION_CHANGE_RECORD = 5
FENCE_BROKER_RECORD = 7
UNFENCE_BROKER_RECORD = 8
REMOVE_TOPIC_RECORD = 9
BROKER_REGISTRATION_CHANGE_RECORD = 17
BEGIN_TRANSACTION_RECORD = 23
END_TRANSACTION_RECORD = 24
ABORT_TRANSACTION_RECORD = 25

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

_SNAPSHOT = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
_SEGMENT = re.compile(r"^(\d{20})\.log$")
_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
#: PartitionChangeRecord's tagged fields: the new ISR, the new leader, the new replicas.
_TAG_ISR, _TAG_LEADER, _TAG_REPLICAS = 0, 1, 2
#: BrokerRegistrationChangeRecord's tagged ``Fenced``: 1 fenced, -1 unfenced, 0 no change.
_TAG_FENCED = 0
#: PartitionChangeRecord's ``Leader``: -2 means "no change".
_LEADER_UNCHANGED = -2

#: Topic config -> its broker-level synonyms in priority order, with the factor that turns
#: the broker value into the topic's unit (Kafka's ``ServerTopicConfigSynonyms``). Only the
#: keys this tool uses, plus the tiered-storage switch.
BROKER_SYNONYMS: dict[str, tuple[tuple[str, int], ...]] = {
    "cleanup.policy": (("log.cleanup.policy", 1),),
    "delete.retention.ms": (("log.cleaner.delete.retention.ms", 1),),
    "min.cleanable.dirty.ratio": (("log.cleaner.min.cleanable.ratio", 1),),
    "min.compaction.lag.ms": (("log.cleaner.min.compaction.lag.ms", 1),),
    "max.compaction.lag.ms": (("log.cleaner.max.compaction.lag.ms", 1),),
    "segment.bytes": (("log.segment.bytes", 1),),
    "segment.index.bytes": (("log.index.size.max.bytes", 1),),
    "index.interval.bytes": (("log.index.interval.bytes", 1),),
    "max.message.bytes": (("message.max.bytes", 1),),
    "retention.ms": (
        ("log.retention.ms", 1),
        ("log.retention.minutes", 60_000),
        ("log.retention.hours", 3_600_000),
    ),
    "retention.bytes": (("log.retention.bytes", 1),),
    "remote.storage.enable": (),
    "min.insync.replicas": (("min.insync.replicas", 1),),
}


@dataclass(frozen=True, slots=True)
class ConfigValue:
    value: str
    source: str
    """``topic`` (set on the topic), ``cluster-default`` (a dynamic default for every broker)
    or ``broker-default`` (a dynamic default of the broker that owns this disk)."""


@dataclass(frozen=True, slots=True)
class OutOfSync:
    """A replica the partition's in-sync replicas do not include, or whose broker is fenced."""

    broker: int
    since_ms: int
    """When the controller recorded it out (the metadata batch's timestamp; module doc)."""
    offline: bool
    """Its broker is fenced (stopped, or not heartbeating) or unregistered."""


@dataclass(frozen=True, slots=True)
class Replication:
    """One partition's replication as the controller recorded it."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    """-1: no leader."""
    out_of_sync: tuple[OutOfSync, ...]
    """The replicas out of the ISR or offline, in replica order."""


@dataclass
class _PartitionState:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    left_isr_ms: dict[int, int]


@dataclass
class ClusterMetadata:
    """Topic configs and broker defaults as of the last metadata record on disk."""

    path: Path
    topics: dict[str, uuid.UUID] = field(default_factory=dict)
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    broker_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    """``""`` is the cluster-wide default; other keys are broker ids."""
    partition_counts: dict[uuid.UUID, int] = field(default_factory=dict)
    """Topic id -> its number of partitions (the highest ``PartitionRecord`` id + 1)."""
    end_offset: int = 0
    """The offset after the last metadata record read (snapshot included)."""
    snapshot: str | None = None
    """The snapshot file the state started from, if any."""
    partitions: dict[tuple[uuid.UUID, int], _PartitionState] = field(default_factory=dict)
    fenced_since_ms: dict[int, int] = field(default_factory=dict)
    """Broker id -> when it was fenced (or unregistered), for the brokers fenced now."""
    last_record_ms: int = -1
    """The timestamp of the newest metadata record read: a live quorum appends a ``NoOpRecord``
    every ``metadata.max.idle.interval.ms`` (500 ms by default), so this says how current the
    replay is (-1: no record read)."""

    def replication(self, topic: str, partition: int) -> Replication | None:
        """The partition's replicas, ISR and leader, and which replicas are out of sync since
        when; None when the metadata does not know the partition."""
        topic_id = self.topics.get(topic)
        state = self.partitions.get((topic_id, partition)) if topic_id is not None else None
        if state is None:
            return None
        out = []
        for broker in state.replicas:
            fenced = self.fenced_since_ms.get(broker)
            left = state.left_isr_ms.get(broker) if broker not in state.isr else None
            if left is not None or fenced is not None:
                since = min(t for t in (left, fenced) if t is not None)
                out.append(OutOfSync(broker, since, fenced is not None))
        return Replication(state.replicas, state.isr, state.leader, tuple(out))

    def partition_count(self, name: str) -> int | None:
        """How many partitions the topic has, as the controller recorded them; None when
        the metadata does not know the topic (what Kafka's default partitioner divides by)."""
        topic_id = self.topics.get(name)
        return None if topic_id is None else self.partition_counts.get(topic_id)

    def topic(self, name: str, broker_id: int | None = None) -> dict[str, ConfigValue]:
        """The topic's effective configs as the cluster knows them: the topic's own keys,
        else a dynamic default of this broker, else the cluster-wide one (Kafka's
        ``KafkaConfig``/``LogConfig`` precedence, static ``server.properties`` excepted).
        Keys nothing sets are absent: the caller's default stands."""
        out: dict[str, ConfigValue] = {}
        own = self.topic_configs.get(name, {}) if name in self.topics else {}
        layers = [(self.broker_configs.get(""), "cluster-default")]
        if broker_id is not None:
            layers.append((self.broker_configs.get(str(broker_id)), "broker-default"))
        for key, synonyms in BROKER_SYNONYMS.items():
            if key in own:
                out[key] = ConfigValue(own[key], "topic")
                continue
            for configs, source in reversed(layers):
                value = _from_synonyms(configs or {}, synonyms)
                if value is not None:
                    out[key] = ConfigValue(value, source)
                    break
        return out


def _from_synonyms(configs: dict[str, str], synonyms: tuple[tuple[str, int], ...]) -> str | None:
    for name, factor in synonyms:
        if name in configs:
            return configs[name] if factor == 1 else str(int(configs[name]) * factor)
    return None


def find_metadata_dir(log_dirs: list[Path]) -> Path | None:
    """The ``__cluster_metadata-0`` among the log dirs (only ``metadata.log.dir`` has one)."""
    for log_dir in log_dirs:
        candidate = Path(log_dir) / METADATA_PARTITION_DIR
        if candidate.is_dir():
            return candidate
    return None


def read_cluster_metadata(partition_dir: str | os.PathLike[str]) -> ClusterMetadata:
    """Replay the newest snapshot and the log after it.

    Raises ``CorruptDataError`` naming the file and position for bytes that are not
    metadata records; a truncated batch at the very end of the last segment (a broker
    killed mid-append) ends the replay, as Kafka's recovery would truncate it.
    """
    return ClusterMetadataReader(partition_dir).refresh()


class ClusterMetadataReader:
    """Keeps a metadata replay current as the controller appends to it.

    A live KRaft quorum appends to ``__cluster_metadata`` all the time (a ``NoOpRecord``
    every ``metadata.max.idle.interval.ms``), so each refresh reads only the bytes added
    since the last one; a new snapshot, a deleted or shrunk segment (truncation) start
    the replay over.
    """

    def __init__(self, partition_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(partition_dir)
        self._state: ClusterMetadata | None = None
        self._replay: _Replay | None = None
        self._read: dict[str, int] = {}  # segment name -> position read up to

    def refresh(self) -> ClusterMetadata:
        names = sorted(os.listdir(self.dir))
        snapshots = sorted((int(m.group(1)), n) for n in names if (m := _SNAPSHOT.match(n)))
        segments = sorted((n for n in names if _SEGMENT.match(n)), key=lambda n: int(n[:20]))
        snapshot = snapshots[-1][1] if snapshots else None
        state = self._state
        if state is None or not self._still_valid(snapshot, segments):
            state = ClusterMetadata(path=self.dir)
            self._replay = _Replay(state)
            self._read = {}
            if snapshots:
                end, name = snapshots[-1]
                self._replay.file(self.dir / name, from_offset=0, last=False)
                state.snapshot = name
                state.end_offset = end
            self._state = state
        assert self._replay is not None
        for i, name in enumerate(segments):
            size = (self.dir / name).stat().st_size
            position = self._read.get(name, 0)
            if position < size:
                last = i == len(segments) - 1
                position = self._replay.file(
                    self.dir / name, from_offset=state.end_offset, last=last, position=position, end=size
                )
            self._read[name] = position
        return state

    def _still_valid(self, snapshot: str | None, segments: list[str]) -> bool:
        assert self._state is not None
        if snapshot != self._state.snapshot and snapshot is not None:
            end = int(snapshot[:20])
            if end > self._state.end_offset:
                return False
        for name, position in self._read.items():
            if name not in segments:
                return False
            if (self.dir / name).stat().st_size < position:
                return False
        return True


class _Replay:
    """Applies metadata records in order, holding those of an open metadata transaction."""

    def __init__(self, state: ClusterMetadata) -> None:
        self.state = state
        self.pending: list[tuple[int, int, int, memoryview, str, int, int]] | None = None

    def file(self, path: Path, *, from_offset: int, last: bool, position: int = 0, end: int | None = None) -> int:
        """Apply the file's records at or above ``from_offset``; returns the position after
        the last complete batch (where the next refresh goes on)."""
        for batches in iter_file_batches(path, position, end, allow_truncated_tail=last):
            position = int(batches.file_positions[-1] + batches.sizes[-1])
            keep = (batches.next_offsets > from_offset) & ~batches.is_control & batches.is_v2
            if not keep.any():
                continue
            selected = batches.select(keep)
            cols = decode_records(selected)
            for i in range(len(cols)):
                offset = int(cols.offsets[i])
                if offset < from_offset:
                    continue
                value = cols.value(i)
                if value is None:
                    continue
                batch_position = int(selected.file_positions[int(cols.batch[i])])
                timestamp_ms = int(cols.timestamps[i])
                self.record(memoryview(value), str(path), batch_position, offset, timestamp_ms)
                self.state.end_offset = offset + 1
                self.state.last_record_ms = max(self.state.last_record_ms, timestamp_ms)
        return position

    def record(self, value: memoryview, path: str, position: int, offset: int, timestamp_ms: int = -1) -> None:
        try:
            _frame, at = decode_unsigned_varint(value, 0)
            api_key, at = decode_unsigned_varint(value, at)
            version, at = decode_unsigned_varint(value, at)
        except CorruptDataError as e:
            raise CorruptRecordError(
                f"metadata record header: {e.reason}", path=path, position=position, offset=offset
            ) from None
        if api_key == BEGIN_TRANSACTION_RECORD:
            self.pending = []
        elif api_key == END_TRANSACTION_RECORD:
            pending, self.pending = self.pending or [], None
            for item in pending:
                self.apply(*item)
        elif api_key == ABORT_TRANSACTION_RECORD:
            self.pending = None
        elif self.pending is not None:
            self.pending.append((api_key, version, at, value, path, offset, timestamp_ms))
        else:
            self.apply(api_key, version, at, value, path, offset, timestamp_ms)

    def apply(
        self, api_key: int, version: int, at: int, value: memoryview, path: str, offset: int, timestamp_ms: int = -1
    ) -> None:
        try:
            reader = _Reader(value, at)
            if api_key in _REPLICATION_RECORDS:
                _REPLICATION_RECORDS[api_key](self.state, reader, version, timestamp_ms)
            elif api_key == TOPIC_RECORD:
                name = reader.string()
                self.state.topics[name] = reader.uuid()
                self.state.topic_configs.pop(name, None)
            elif api_key == REMOVE_TOPIC_RECORD:
                topic_id = reader.uuid()
                self.state.partition_counts.pop(topic_id, None)
                for key in [k for k in self.state.partitions if k[0] == topic_id]:
                    del self.state.partitions[key]
                for name, known in list(self.state.topics.items()):
                    if known == topic_id:
                        del self.state.topics[name]
                        self.state.topic_configs.pop(name, None)
            elif api_key == CONFIG_RECORD:
                resource_type = reader.int8()
                resource = reader.string()
                key = reader.string()
                config_value = reader.nullable_string()
                table = {RESOURCE_TOPIC: self.state.topic_configs, RESOURCE_BROKER: self.state.broker_configs}
                configs = table.get(resource_type)
                if configs is not None:
                    if config_value is None:
                        configs.get(resource, {}).pop(key, None)
                    else:
                        configs.setdefault(resource, {})[key] = config_value
        except (IndexError, ValueError, struct.error, CorruptDataError) as e:
            raise CorruptRecordError(
                f"metadata record (API key {api_key}) does not decode: {e}", path=path, offset=offset
            ) from None


class _Reader:
    """Kafka's flexible-version field encoding: compact strings (length + 1 as an unsigned
    varint, 0 for null), 16-byte UUIDs."""

    def __init__(self, buf: memoryview, at: int) -> None:
        self.buf = buf
        self.at = at

    def int8(self) -> int:
        (v,) = _INT8.unpack_from(self.buf, self.at)
        self.at += 1
        return v

    def int16(self) -> int:
        (v,) = _INT16.unpack_from(self.buf, self.at)
        self.at += 2
        return v

    def int32(self) -> int:
        (v,) = _INT32.unpack_from(self.buf, self.at)
        self.at += 4
        return v

    def int64(self) -> int:
        (v,) = _INT64.unpack_from(self.buf, self.at)
        self.at += 8
        return v

    def int32_array(self) -> tuple[int, ...] | None:
        """A compact array of int32 (length + 1; 0 for null)."""
        length, self.at = decode_unsigned_varint(self.buf, self.at)
        if length == 0:
            return None
        return tuple(self.int32() for _ in range(length - 1))

    def tagged_fields(self) -> dict[int, _Reader]:
        """The tagged fields at the reader's position: tag -> a reader of its bytes."""
        count, self.at = decode_unsigned_varint(self.buf, self.at)
        out = {}
        for _ in range(count):
            tag, self.at = decode_unsigned_varint(self.buf, self.at)
            size, self.at = decode_unsigned_varint(self.buf, self.at)
            if self.at + size > len(self.buf):
                raise ValueError(f"tagged field {tag} of {size} bytes past the record's end")
            out[tag] = _Reader(self.buf, self.at)
            self.at += size
        return out

    def skip_struct_array(self, read_fields: Callable[[_Reader], None]) -> None:
        """A compact array of structs, each its fields then its tagged fields: skipped."""
        length, self.at = decode_unsigned_varint(self.buf, self.at)
        for _ in range(max(length - 1, 0)):
            read_fields(self)
            self.tagged_fields()

    def nullable_string(self) -> str | None:
        length, self.at = decode_unsigned_varint(self.buf, self.at)
        if length == 0:
            return None
        end = self.at + length - 1
        if end > len(self.buf):
            raise ValueError(f"string of {length - 1} bytes past the record's end")
        text = bytes(self.buf[self.at : end]).decode("utf-8")
        self.at = end
        return text

    def string(self) -> str:
        text = self.nullable_string()
        if text is None:
            raise ValueError("null in a non-nullable string")
        return text

    def uuid(self) -> uuid.UUID:
        raw = bytes(self.buf[self.at : self.at + 16])
        if len(raw) != 16:
            raise ValueError("UUID past the record's end")
        self.at += 16
        return uuid.UUID(bytes=raw)


def _partition_record(state: ClusterMetadata, reader: _Reader, version: int, timestamp_ms: int) -> None:
    """A partition as created (or as a snapshot holds it): replicas not in its ISR are out
    since this record's time (at least)."""
    partition = reader.int32()
    topic_id = reader.uuid()
    replicas = reader.int32_array() or ()
    isr = reader.int32_array() or ()
    reader.int32_array()  # RemovingReplicas
    reader.int32_array()  # AddingReplicas
    leader = reader.int32()
    known = state.partition_counts.get(topic_id, 0)
    state.partition_counts[topic_id] = max(known, partition + 1)
    state.partitions[(topic_id, partition)] = _PartitionState(
        replicas, isr, leader, {b: timestamp_ms for b in replicas if b not in isr}
    )


def _partition_change_record(state: ClusterMetadata, reader: _Reader, version: int, timestamp_ms: int) -> None:
    """A change of the ISR, the leader or the replicas (every field tagged: absent, unchanged)."""
    partition = reader.int32()
    topic_id = reader.uuid()
    current = state.partitions.get((topic_id, partition))
    tags = reader.tagged_fields()
    if current is None:
        return  # a change to a partition this replay never saw created (a deleted topic)
    if _TAG_REPLICAS in tags:
        current.replicas = tags[_TAG_REPLICAS].int32_array() or ()
    if _TAG_LEADER in tags:
        leader = tags[_TAG_LEADER].int32()
        if leader != _LEADER_UNCHANGED:
            current.leader = leader
    if _TAG_ISR in tags:
        isr = tags[_TAG_ISR].int32_array()
        if isr is not None:
            for broker in current.isr:
                if broker not in isr:
                    current.left_isr_ms[broker] = timestamp_ms
            current.isr = isr
    for broker in list(current.left_isr_ms):
        if broker in current.isr or broker not in current.replicas:
            del current.left_isr_ms[broker]
    for broker in current.replicas:
        if broker not in current.isr:
            current.left_isr_ms.setdefault(broker, timestamp_ms)


def _register_broker_record(state: ClusterMetadata, reader: _Reader, version: int, timestamp_ms: int) -> None:
    """A registration: ``Fenced`` says whether the broker may serve (a new registration is
    fenced until its first heartbeat unfences it; a snapshot records the state it had)."""
    broker = reader.int32()
    if version >= 2:
        reader.int8()  # IsMigratingZkBroker
    reader.uuid()  # IncarnationId
    reader.int64()  # BrokerEpoch

    def endpoint(r: _Reader) -> None:
        r.string(), r.string(), r.int16(), r.int16()  # Name, Host, Port, SecurityProtocol

    def feature(r: _Reader) -> None:
        r.string(), r.int16(), r.int16()  # Name, MinSupportedVersion, MaxSupportedVersion

    reader.skip_struct_array(endpoint)
    reader.skip_struct_array(feature)
    reader.nullable_string()  # Rack
    _set_fenced(state, broker, reader.int8() != 0, timestamp_ms)


def _fenced_by_record(fenced: bool) -> Callable[[ClusterMetadata, _Reader, int, int], None]:
    def apply(state: ClusterMetadata, reader: _Reader, version: int, timestamp_ms: int) -> None:
        _set_fenced(state, reader.int32(), fenced, timestamp_ms)

    return apply


def _broker_registration_change_record(
    state: ClusterMetadata, reader: _Reader, version: int, timestamp_ms: int
) -> None:
    broker = reader.int32()
    reader.int64()  # BrokerEpoch
    tags = reader.tagged_fields()
    if _TAG_FENCED in tags:
        fenced = tags[_TAG_FENCED].int8()
        if fenced != 0:
            _set_fenced(state, broker, fenced > 0, timestamp_ms)


def _set_fenced(state: ClusterMetadata, broker: int, fenced: bool, timestamp_ms: int) -> None:
    if fenced:
        state.fenced_since_ms.setdefault(broker, timestamp_ms)
    else:
        state.fenced_since_ms.pop(broker, None)


_REPLICATION_RECORDS: dict[int, Callable[[ClusterMetadata, _Reader, int, int], None]] = {
    PARTITION_RECORD: _partition_record,
    PARTITION_CHANGE_RECORD: _partition_change_record,
    REGISTER_BROKER_RECORD: _register_broker_record,
    UNREGISTER_BROKER_RECORD: _fenced_by_record(True),
    FENCE_BROKER_RECORD: _fenced_by_record(True),
    UNFENCE_BROKER_RECORD: _fenced_by_record(False),
    BROKER_REGISTRATION_CHANGE_RECORD: _broker_registration_change_record,
}


def iter_metadata_files(partition_dir: Path) -> Iterator[Path]:
    """The files ``read_cluster_metadata`` reads (for change detection by callers)."""
    for name in sorted(os.listdir(partition_dir)):
        if _SNAPSHOT.match(name) or _SEGMENT.match(name):
            yield partition_dir / name
