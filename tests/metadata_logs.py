"""Test helpers: KRaft metadata records (``__cluster_metadata``) written as a controller
would append them, for the tests of the cluster's topic configs."""

from __future__ import annotations

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


def _record(api_key: int, body: bytes) -> bytes:
    # frame version 1, API key, version 0, the fields, no tagged fields.
    return _uvarint(1) + _uvarint(api_key) + _uvarint(0) + body + b"\x00"


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
