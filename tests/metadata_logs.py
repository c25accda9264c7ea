"""Test helpers: KRaft metadata records (``__cluster_metadata``) written as a controller
would append them, for the tests of the cluster's topic configs."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path

from cleaner.records.builder import build_batch
from cleaner.records.record import Record


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def compact_string(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    raw = text.encode()
    return _uvarint(len(raw) + 1) + raw


def _record(api_key: int, body: bytes, *, version: int = 0, tagged: bytes = b"\x00") -> bytes:
    # frame version 1, API key, record version, the fields, the tagged fields (none by default).
    return _uvarint(1) + _uvarint(api_key) + _uvarint(version) + body + tagged


def topic_record(name: str, topic_id: uuid.UUID) -> bytes:
    return _record(2, compact_string(name) + topic_id.bytes)


def remove_topic_record(topic_id: uuid.UUID) -> bytes:
    return _record(9, topic_id.bytes)


def config_record(resource_type: int, resource: str, key: str, value: str | None) -> bytes:
    return _record(4, bytes([resource_type]) + compact_string(resource) + compact_string(key) + compact_string(value))


BEGIN, END, ABORT = _record(23, b""), _record(24, b""), _record(25, b"")


def write_metadata_log(path: Path, values: list[bytes], base_offset: int = 0, per_batch: int = 3) -> int:
    """Metadata records in batches of ``per_batch``, as the controller appends them."""
    out = bytearray()
    offset = base_offset
    for i in range(0, len(values), per_batch):
        chunk = values[i : i + per_batch]
        records = [Record(offset + j, 1_700_000_000_000, None, v, ()) for j, v in enumerate(chunk)]
        out += build_batch(records)
        offset += len(chunk)
    path.write_bytes(bytes(out))
    return offset


# -- replication: partitions, ISRs, brokers (the replication race, the ISR gate) --------------
TOPIC_ID = uuid.UUID(int=7)
"""The topic id ``partition_record`` and ``isr_change`` use unless told another."""


def _int32s(values: list[int] | None) -> bytes:
    if values is None:
        return b"\x00"
    return _uvarint(len(values) + 1) + b"".join(struct.pack(">i", v) for v in values)


def _tags(fields: dict[int, bytes]) -> bytes:
    return _uvarint(len(fields)) + b"".join(_uvarint(t) + _uvarint(len(v)) + v for t, v in sorted(fields.items()))


def partition_record(
    partition: int, replicas: list[int], isr: list[int], leader: int, topic_id: uuid.UUID = TOPIC_ID
) -> bytes:
    body = struct.pack(">i", partition) + topic_id.bytes + _int32s(replicas) + _int32s(isr)
    body += _int32s([]) + _int32s([]) + struct.pack(">iii", leader, 0, 0)
    return _record(3, body)


def isr_change(partition: int, isr: list[int], leader: int | None = None, topic_id: uuid.UUID = TOPIC_ID) -> bytes:
    fields = {0: _int32s(isr)}
    if leader is not None:
        fields[1] = struct.pack(">i", leader)
    return _record(5, struct.pack(">i", partition) + topic_id.bytes, tagged=_tags(fields))


def register_broker(broker: int, *, fenced: bool) -> bytes:
    """RegisterBrokerRecord v3: one endpoint, one feature, a rack, then Fenced."""
    endpoint = compact_string("PLAINTEXT") + compact_string("kafka-1") + struct.pack(">Hh", 9092, 0) + b"\x00"
    feature = compact_string("metadata.version") + struct.pack(">hh", 1, 20) + b"\x00"
    body = struct.pack(">i", broker) + b"\x00" + uuid.uuid4().bytes + struct.pack(">q", 5)
    body += _uvarint(2) + endpoint + _uvarint(2) + feature + compact_string("rack-a")
    body += bytes([1 if fenced else 0, 0])  # Fenced, InControlledShutdown
    return _record(0, body, version=3)


def fence(broker: int) -> bytes:
    return _record(7, struct.pack(">iq", broker, 5))


def registration_change(broker: int, fenced: int) -> bytes:
    return _record(17, struct.pack(">iq", broker, 5), version=1, tagged=_tags({0: struct.pack(">b", fenced)}))


def write_metadata(directory: Path, batches: list[tuple[int, list[bytes]]]) -> Path:
    """``__cluster_metadata-0`` with one batch per (timestamp, records)."""
    d = directory / "__cluster_metadata-0"
    d.mkdir()
    out, offset = bytearray(), 0
    for ts, values in batches:
        out += build_batch([Record(offset + i, ts, None, v, ()) for i, v in enumerate(values)], base_offset=offset)
        offset += len(values)
    (d / "00000000000000000000.log").write_bytes(bytes(out))
    return d
