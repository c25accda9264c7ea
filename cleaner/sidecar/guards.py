"""Partitions stage mode refuses, each with the reason ``/status`` and ``status`` report.

Nothing is written for a refused partition:

- ``__cluster_metadata``: the KRaft metadata log is the controller's, never a topic's.
- the broker compacts it itself: it is in the log dir's ``cleaner-offset-checkpoint`` (the
  broker's cleaner cleaned it at least once), or the cluster's own topic config (the KRaft
  metadata on this disk, ``cleaner.effective_config``) says ``compact``, which the broker's
  cleaner acts on (``log.cleaner.enable`` is true by default). Two cleaners on one
  partition would fight over the same ``.cleaned`` names and commit stale work.
- tiered logs: ``remote.storage.enable=true``, or a ``log-start-offset-checkpoint`` entry at
  or below the first local segment (Kafka writes an entry only when the log start is above
  the first segment, or for a log with remote storage). A merged segment would be uploaded
  again from its base, and remote storage would hold overlapping segments.

The two other guards act where the files are: the broker's uid (``stage.make_usable_by``)
and free disk (``stage.free_disk_allows``, ``stage.evict_for_disk``).
"""

from __future__ import annotations

from collections.abc import Mapping

from cleaner.engine.manager import ManagedLog
from cleaner.storage.cluster_metadata import METADATA_TOPIC
from cleaner.storage.topic_partition import TopicPartition


def stage_refusal(
    managed: ManagedLog,
    *,
    cleaner_checkpoint: Mapping[TopicPartition, int],
    log_start_checkpoint: Mapping[TopicPartition, int],
) -> str | None:
    """Why stage mode must not touch this partition, or None."""
    tp = managed.topic_partition
    if tp.topic == METADATA_TOPIC:
        return "the KRaft metadata log (__cluster_metadata) is never staged"
    if tp in cleaner_checkpoint:
        return "the broker compacts this partition itself (it is in cleaner-offset-checkpoint)"
    config = managed.config
    if config is not None and config.remote_storage:
        return "tiered storage (remote.storage.enable=true): a merged segment would be uploaded again"
    if config is not None and config.cluster_known and managed.rule.compact:
        return (
            "the cluster's topic config says cleanup.policy=compact: the broker's own cleaner compacts it "
            "(log.cleaner.enable defaults to true)"
        )
    segments = managed.log.segments
    start = log_start_checkpoint.get(tp)
    if start is not None and segments and start <= segments[0].base_offset:
        return (
            f"a tiered log: log-start-offset-checkpoint holds {start}, at or below the first local segment "
            f"{segments[0].base_offset} (Kafka writes such an entry only for remote storage)"
        )
    return None
