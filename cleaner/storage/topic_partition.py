"""Topic-partition names and how partition directories are named on disk."""

from __future__ import annotations

import re
from typing import NamedTuple

METADATA_TOPIC = "__cluster_metadata"
"""The KRaft metadata log: the controller's, not a topic. Kafka's LogManager never loads it,
so no cleaner, stage or policy ever touches it (snapshots keep it short)."""

# LogManager/UnifiedLog: "<topic>-<partition>" plus, for directories that must not be
# cleaned, ".<uuid>-delete", ".<uuid>-future" or ".<uuid>-stray".
_SPECIAL_DIR = re.compile(r"^(?P<tp>.+)\.[0-9a-f]{32}-(?P<kind>delete|future|stray)$")
_PLAIN_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>0|[1-9][0-9]*)$")


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def dir_name(self) -> str:
        return str(self)


def parse_partition_dir(name: str) -> TopicPartition | None:
    """The partition a plain partition directory holds, or None for anything else
    (files, ``-delete``/``-future``/``-stray`` directories, names that do not parse)."""
    if _SPECIAL_DIR.match(name):
        return None
    m = _PLAIN_DIR.match(name)
    if m is None:
        return None
    return TopicPartition(m["topic"], int(m["partition"]))


def special_dir_kind(name: str) -> str | None:
    """``delete``, ``future`` or ``stray`` for directories a cleaner must skip, else None."""
    m = _SPECIAL_DIR.match(name)
    return m["kind"] if m else None
