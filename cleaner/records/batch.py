"""Record batch v2 header (Kafka's ``DefaultRecordBatch``), scalar and columnar.

Layout (all big-endian, 61 bytes before the records)::

    0 baseOffset i64 | 8 length i32 | 12 partitionLeaderEpoch i32 | 16 magic i8 | 17 crc u32
    21 attributes i16 | 23 lastOffsetDelta i32 | 27 baseTimestamp i64 | 35 maxTimestamp i64
    43 producerId i64 | 51 producerEpoch i16 | 53 baseSequence i32 | 57 recordsCount i32

The CRC-32C covers bytes [21, end). ``partitionLeaderEpoch`` is outside it so a leader can
stamp it without recomputing the CRC.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import numpy as np

LOG_OVERHEAD = 12  # baseOffset + length: every entry of a log starts with these
RECORD_BATCH_OVERHEAD = 61
MIN_LEGACY_ENTRY_LENGTH = 14  # LegacyRecord.RECORD_OVERHEAD_V0: below this no entry is valid
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
CURRENT_MAGIC = 2
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1
INT32_MAX = 2**31 - 1

HEADER = struct.Struct(">qiibIhiqqqhii")
assert HEADER.size == RECORD_BATCH_OVERHEAD

# The same layout for numpy: a chunk of batch headers gathered into one array is
# decoded one field at a time instead of one batch at a time.
HEADER_DTYPE = np.dtype(
    [
        ("base_offset", ">i8"),
        ("length", ">i4"),
        ("partition_leader_epoch", ">i4"),
        ("magic", "i1"),
        ("crc", ">u4"),
        ("attributes", ">i2"),
        ("last_offset_delta", ">i4"),
        ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"),
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("base_sequence", ">i4"),
        ("records_count", ">i4"),
    ]
)
assert HEADER_DTYPE.itemsize == RECORD_BATCH_OVERHEAD


class Attributes:
    """Bits of the v2 attributes (only the low byte is used by readers). Plain ints, not
    an ``IntFlag``: they are combined per batch on hot paths."""

    COMPRESSION_MASK = 0x07
    LOG_APPEND_TIME = 0x08
    TRANSACTIONAL = 0x10
    CONTROL = 0x20
    DELETE_HORIZON = 0x40


class TimestampType(enum.IntEnum):
    NO_TIMESTAMP_TYPE = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` with Kafka's int32 wrap to 0 (DefaultRecordBatch.incrementSequence)."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of one batch, plus where it sits in its file.

    For legacy (magic 0/1) entries only ``base_offset`` (the wrapper offset, which is the
    *last* inner offset), ``length``, ``magic``, ``attributes`` (codec and timestamp type)
    and the timestamps are meaningful; ``cleaner.records.legacy`` decodes the rest.
    """

    base_offset: int
    length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int = 0

    @classmethod
    def parse(
        cls, buf: bytes | bytearray | memoryview, position: int = 0, file_position: int | None = None
    ) -> BatchHeader:
        """Decode the 61-byte header at ``position`` of ``buf`` (no validation)."""
        fields = HEADER.unpack_from(buf, position)
        return cls(*fields, position=position if file_position is None else file_position)

    def pack(self) -> bytes:
        return HEADER.pack(
            self.base_offset,
            self.length,
            self.partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        )

    # Derived values, named as in Kafka's RecordBatch interface.
    @property
    def size_in_bytes(self) -> int:
        return LOG_OVERHEAD + self.length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> int:
        """Codec id 0..4 (``cleaner.records.compression.CompressionType``)."""
        return self.attributes & Attributes.COMPRESSION_MASK

    @property
    def timestamp_type(self) -> TimestampType:
        if self.magic == 0:
            return TimestampType.NO_TIMESTAMP_TYPE
        return (
            TimestampType.LOG_APPEND_TIME if self.attributes & Attributes.LOG_APPEND_TIME else TimestampType.CREATE_TIME
        )

    @property
    def is_transactional(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & Attributes.TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & Attributes.CONTROL)

    @property
    def has_delete_horizon(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & Attributes.DELETE_HORIZON)

    @property
    def delete_horizon_ms(self) -> int | None:
        """KIP-534: when attribute bit 6 is set, ``baseTimestamp`` holds the delete horizon."""
        return self.base_timestamp if self.has_delete_horizon else None

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)
