"""Message format v0/v1 ("legacy", Kafka's ``LegacyRecord`` and ``AbstractLegacyRecordBatch``), decode only.

Each shallow entry of a log::

    offset i64 | size i32 | crc u32 | magic i8 | attributes i8 | [timestamp i64, v1 only]
    | keyLength i32 | key | valueLength i32 | value

``crc`` is CRC-32 (IEEE, ``zlib.crc32``) over magic..end. Attributes: bits 0-2 the codec
(gzip, snappy, lz4; zstd is not allowed before v2), bit 3 the timestamp type (v1 only).

An uncompressed entry is one record. A compressed entry is a *wrapper*: its value is a
compressed message set of inner entries, and its offset is the offset of the *last* inner
message. v0 inner offsets are absolute; v1 inner offsets are relative (0..n-1 as written by
producers), made absolute as ``wrapperOffset - lastInnerOffset + innerOffset``. A v1 wrapper
with LogAppendTime carries the append time, which replaces every inner timestamp.

The cleaner only reads this format: Kafka >= 4.0 rewrites every legacy batch it retains as v2
(KAFKA-13093), and ``cleaner.records.builder`` writes v2. Legacy data is rare and small next
to v2, so this module decodes one message at a time in plain Python; it is the reference for
``dump --deep`` and for the columns the scanner fills for legacy rows.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from cleaner.errors import CorruptRecordError, InvalidRecordError
from cleaner.records.batch import LOG_OVERHEAD, MIN_LEGACY_ENTRY_LENGTH, Attributes, TimestampType
from cleaner.records.compression import CompressionType, decompress
from cleaner.records.record import Record

__all__ = [
    "RECORD_OVERHEAD_V0",
    "RECORD_OVERHEAD_V1",
    "LegacyEntry",
    "decode_legacy_entry",
]

RECORD_OVERHEAD_V0 = MIN_LEGACY_ENTRY_LENGTH  # crc 4 + magic 1 + attributes 1 + keyLength 4 + valueLength 4
RECORD_OVERHEAD_V1 = RECORD_OVERHEAD_V0 + 8  # + timestamp
TIMESTAMP_TYPE_MASK = 0x08
NO_TIMESTAMP = -1

_LOG_HEADER = struct.Struct(">qi")  # offset, size
_MESSAGE_HEADER = struct.Struct(">Ibb")  # crc, magic, attributes
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_CRC_HEADER_V0 = struct.Struct(">bbi")  # magic, attributes, keyLength
_CRC_HEADER_V1 = struct.Struct(">bbqi")  # magic, attributes, timestamp, keyLength
_KEY_LENGTH_POSITION = LOG_OVERHEAD + _MESSAGE_HEADER.size  # v0; v1 adds the timestamp


@dataclass(frozen=True, slots=True)
class LegacyEntry:
    """One shallow v0/v1 entry (a plain message or a compressed wrapper) of a buffer.

    ``offset`` is the entry's own offset field (for a wrapper: the last inner offset),
    ``position`` where the entry starts in the decoded buffer, ``size_in_bytes`` its size
    including the 12-byte log overhead. ``timestamp`` is -1 for v0. ``trailing`` holds bytes
    between the end of the value and the end of the message: Kafka never writes any but its
    reader ignores them, so they are kept only for the CRC.
    """

    offset: int
    magic: int
    attributes: int
    timestamp: int
    crc: int
    key: bytes | None
    value: bytes | None
    position: int
    size_in_bytes: int
    trailing: bytes = field(default=b"", repr=False)

    @property
    def compression(self) -> int:
        """Codec id (``CompressionType``) from attribute bits 0-2; 0 for a plain message."""
        return self.attributes & Attributes.COMPRESSION_MASK

    @property
    def is_compressed(self) -> bool:
        return self.compression != CompressionType.NONE

    @property
    def timestamp_type(self) -> TimestampType:
        """NO_TIMESTAMP_TYPE for v0 (whatever bit 3 says); bit 3 for v1."""
        if self.magic == 0:
            return TimestampType.NO_TIMESTAMP_TYPE
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def last_offset(self) -> int:
        """Kafka's ``lastOffset()`` of a legacy batch: the entry's offset field."""
        return self.offset

    @property
    def value_position(self) -> int:
        """Where the value starts in the decoded buffer (-1 for a null value)."""
        if self.value is None:
            return -1
        return self.position + self.size_in_bytes - len(self.trailing) - len(self.value)

    def computed_crc(self) -> int:
        """CRC-32 of magic..end, rebuilt from the decoded fields (no buffer is kept)."""
        key_length = -1 if self.key is None else len(self.key)
        if self.magic == 0:
            head = _CRC_HEADER_V0.pack(self.magic, self.attributes, key_length)
        else:
            head = _CRC_HEADER_V1.pack(self.magic, self.attributes, self.timestamp, key_length)
        crc = zlib.crc32(head)
        if self.key is not None:
            crc = zlib.crc32(self.key, crc)
        crc = zlib.crc32(_INT32.pack(-1 if self.value is None else len(self.value)), crc)
        if self.value is not None:
            crc = zlib.crc32(self.value, crc)
        if self.trailing:
            crc = zlib.crc32(self.trailing, crc)
        return crc

    def is_valid_crc(self) -> bool:
        """Whether the stored CRC matches the content (Kafka's ``LegacyRecord.isValid``)."""
        return self.crc == self.computed_crc()

    def inner_entries(self, *, verify_crc: bool = False, max_size: int | None = None) -> list[LegacyEntry]:
        """The inner messages of a compressed wrapper, as stored.

        Offsets are the stored ones (relative for a v1 wrapper); ``position`` is relative to
        the decompressed value. Structural checks are those of Kafka's deep iterator: a
        null wrapper value, zstd, an empty inner set and nested compression are invalid;
        an inner entry cut short at the end of the decompressed data ends the set, as in
        Kafka's ``DataLogInputStream``. ``max_size`` bounds the decompressed value.
        """
        if not self.is_compressed:
            raise ValueError("inner_entries() needs a compressed wrapper entry")
        codec = self.compression
        if codec == CompressionType.ZSTD:
            raise InvalidRecordError(
                f"compression codec zstd is not allowed in message format v{self.magic}",
                position=self.position,
                offset=self.offset,
            )
        if codec > CompressionType.ZSTD:
            raise CorruptRecordError(
                f"unknown compression codec id {codec}", position=self.position, offset=self.offset
            )
        if self.value is None:
            raise InvalidRecordError(
                f"found invalid compressed record set with null value (magic = {self.magic})",
                position=self.position,
                offset=self.offset,
            )
        try:
            data = decompress(codec, self.value, max_size=max_size, magic=self.magic)
        except CorruptRecordError as e:
            where = self.value_position + e.position if e.position is not None else self.position
            raise CorruptRecordError(
                f"cannot decompress the wrapper's value: {e.reason}", position=where, offset=self.offset
            ) from None

        inner: list[LegacyEntry] = []
        n = len(data)
        pos = 0
        while n - pos >= LOG_OVERHEAD:
            _, size = _LOG_HEADER.unpack_from(data, pos)
            if size >= MIN_LEGACY_ENTRY_LENGTH and size > n - pos - LOG_OVERHEAD:
                break  # Kafka's DataLogInputStream: an incomplete last entry ends the stream
            try:
                entry = decode_legacy_entry(data, pos, verify_crc=verify_crc)
            except CorruptRecordError as e:
                raise type(e)(
                    f"inner message at byte {pos} of the decompressed value: {e.reason}",
                    position=self.position,
                    offset=self.offset,
                ) from None
            if entry.is_compressed:
                raise InvalidRecordError(
                    f"inner message at byte {pos} of the decompressed value is compressed "
                    "(nested compression is invalid)",
                    position=self.position,
                    offset=self.offset,
                )
            inner.append(entry)
            pos += entry.size_in_bytes
        if not inner:
            raise InvalidRecordError(
                "found invalid compressed record set with no inner records",
                position=self.position,
                offset=self.offset,
            )
        return inner

    def records(self, *, verify_crc: bool = False, max_size: int | None = None) -> list[Record]:
        """The records of this entry as Kafka's deep iteration reports them.

        A plain message is one record with the entry's offset and timestamp (-1 for v0). A
        wrapper yields its inner messages with absolute offsets and these timestamps:
        v0 inner messages -1; v1 inner messages the wrapper's timestamp when the wrapper
        (v1) is LogAppendTime, their own otherwise. A v1 wrapper whose offset is 0 keeps the
        relative offsets (librdkafka once wrote such produce requests; Kafka does the same).
        ``verify_crc`` also checks the inner messages' CRCs.
        """
        if not self.is_compressed:
            return [Record(self.offset, self.timestamp, self.key, self.value)]
        inner = self.inner_entries(verify_crc=verify_crc, max_size=max_size)
        if self.magic == 1:
            last_inner = inner[-1].offset
            if self.offset == 0:
                base = 0
            elif self.offset < last_inner:
                raise InvalidRecordError(
                    f"found invalid wrapper offset in compressed v1 message set, wrapper offset "
                    f"'{self.offset}' is less than the last inner message offset '{last_inner}' and it is not zero",
                    position=self.position,
                    offset=self.offset,
                )
            else:
                base = self.offset - last_inner
        else:
            base = 0
        wrapper_log_append_time = self.magic == 1 and bool(self.attributes & TIMESTAMP_TYPE_MASK)
        records = []
        previous = None
        for entry in inner:
            offset = base + entry.offset
            if previous is not None and offset <= previous:
                raise CorruptRecordError(
                    f"inner offsets are not increasing ({offset} follows {previous})",
                    position=self.position,
                    offset=self.offset,
                )
            previous = offset
            if entry.magic == 0:
                timestamp = NO_TIMESTAMP
            elif wrapper_log_append_time:
                timestamp = self.timestamp
            else:
                timestamp = entry.timestamp
            records.append(Record(offset, timestamp, entry.key, entry.value))
        return records


def decode_legacy_entry(
    buf: bytes | bytearray | memoryview, position: int = 0, *, verify_crc: bool = False
) -> LegacyEntry:
    """Decode the v0/v1 entry starting at ``position`` of ``buf`` (shallow: no decompression).

    Raises ``CorruptRecordError`` (positions relative to ``buf``) for a size below 14, an
    entry extending past the buffer, a magic other than 0/1, a key or value length below -1
    or past the end of the message, and, with ``verify_crc``, ``InvalidRecordError`` for a
    CRC mismatch. Kafka's reader treats any negative length as null; -2 and below cannot be
    written by any Kafka, so they are reported as corruption here.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    n = mv.nbytes
    if position < 0 or n - position < LOG_OVERHEAD:
        raise CorruptRecordError(
            f"truncated entry: {max(n - position, 0)} bytes left, the log overhead alone is {LOG_OVERHEAD}",
            position=position,
        )
    offset, size = _LOG_HEADER.unpack_from(mv, position)
    if size < MIN_LEGACY_ENTRY_LENGTH:
        raise CorruptRecordError(
            f"record size {size} is less than the minimum record overhead ({MIN_LEGACY_ENTRY_LENGTH})",
            position=position,
            offset=offset,
        )
    end = position + LOG_OVERHEAD + size
    if end > n:
        raise CorruptRecordError(
            f"truncated entry: size {size} but {n - position - LOG_OVERHEAD} bytes follow the log overhead",
            position=position,
            offset=offset,
        )
    crc, magic, attributes = _MESSAGE_HEADER.unpack_from(mv, position + LOG_OVERHEAD)
    if magic not in (0, 1):
        raise CorruptRecordError(f"invalid magic {magic} for a v0/v1 message", position=position, offset=offset)
    p = position + _KEY_LENGTH_POSITION
    if magic == 1:
        if size < RECORD_OVERHEAD_V1:
            raise CorruptRecordError(
                f"record size {size} is less than the v1 record overhead ({RECORD_OVERHEAD_V1})",
                position=position,
                offset=offset,
            )
        (timestamp,) = _INT64.unpack_from(mv, p)
        p += _INT64.size
    else:
        timestamp = NO_TIMESTAMP
    key, p = _sized_bytes(mv, p, end, "key", position, offset)
    value, p = _sized_bytes(mv, p, end, "value", position, offset)
    if verify_crc:
        computed = zlib.crc32(mv[position + LOG_OVERHEAD + 4 : end])
        if computed != crc:
            raise InvalidRecordError(
                f"record is corrupt (stored crc = {crc}, computed crc = {computed})",
                position=position,
                offset=offset,
            )
    return LegacyEntry(
        offset=offset,
        magic=magic,
        attributes=attributes,
        timestamp=timestamp,
        crc=crc,
        key=key,
        value=value,
        position=position,
        size_in_bytes=LOG_OVERHEAD + size,
        trailing=mv[p:end].tobytes() if p < end else b"",
    )


def _sized_bytes(mv: memoryview, p: int, end: int, what: str, position: int, offset: int) -> tuple[bytes | None, int]:
    """An int32-length-prefixed field (length -1 = null) that must lie inside the message."""
    if end - p < _INT32.size:
        raise CorruptRecordError(
            f"the {what} length field lies beyond the end of the message", position=position, offset=offset
        )
    (length,) = _INT32.unpack_from(mv, p)
    p += _INT32.size
    if length == -1:
        return None, p
    if length < 0:
        raise CorruptRecordError(f"invalid {what} length {length}", position=position, offset=offset)
    if length > end - p:
        raise CorruptRecordError(
            f"{what} of {length} bytes extends beyond the end of the message ({end - p} bytes left)",
            position=position,
            offset=offset,
        )
    return mv[p : p + length].tobytes(), p + length
