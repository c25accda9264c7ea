"""One record, the scalar form.

The engine never materialises records one Python object at a time on its hot path (see
``cleaner.records.columns``); this dataclass is the convenient form for the generator,
``dump --deep``, legacy (v0/v1) decoding and tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = field(default=())

    @property
    def is_tombstone(self) -> bool:
        """A null value with a non-null key deletes the key once compacted."""
        return self.value is None and self.key is not None
