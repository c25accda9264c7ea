"""Control records: the single record of a control batch (attribute bit 5).

Key: ``version int16, type int16``. ABORT/COMMIT markers carry an ``EndTxnMarker`` value
(``version int16 = 0, coordinatorEpoch int32``). The cleaner never deduplicates control
records by key (KAFKA_NOTES §1.4): only the transaction rules remove markers.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from cleaner.errors import CorruptRecordError

_KEY = struct.Struct(">hh")
_END_TXN_VALUE = struct.Struct(">hi")


class ControlRecordType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6
    UNKNOWN = -1

    @classmethod
    def parse_key(cls, key: bytes | None) -> ControlRecordType:
        """Type of a control record from its key; a negative version is corruption,
        a higher version is read as version 0 (Kafka's ControlRecordType.parse)."""
        if key is None or len(key) < 4:
            raise CorruptRecordError(f"control record key too short ({0 if key is None else len(key)} bytes)")
        version, type_id = _KEY.unpack_from(key)
        if version < 0:
            raise CorruptRecordError(f"control record key has negative version {version}")
        try:
            return cls(type_id)
        except ValueError:
            return cls.UNKNOWN

    def key_bytes(self) -> bytes:
        return _KEY.pack(0, int(self))


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    """Value of an ABORT or COMMIT control record."""

    type: ControlRecordType
    coordinator_epoch: int

    def value_bytes(self) -> bytes:
        return _END_TXN_VALUE.pack(0, self.coordinator_epoch)

    @classmethod
    def parse(cls, type_: ControlRecordType, value: bytes | None) -> EndTxnMarker:
        if value is None or len(value) < _END_TXN_VALUE.size:
            raise CorruptRecordError("end transaction marker value too short")
        version, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
        if version < 0:
            raise CorruptRecordError(f"end transaction marker has invalid version {version}")
        return cls(type_, coordinator_epoch)
