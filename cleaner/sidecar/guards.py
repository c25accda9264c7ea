"""Partitions stage mode refuses, each with the reason ``/status`` and ``status`` report.

Nothing is written for a refused partition:

- the broker compacts it itself: it is in the log dir's ``cleaner-offset-checkpoint`` (the
  broker's cleaner cleaned it at least once), or the cluster's own topic config (the KRaft
  metadata on this disk, ``cleaner.effective_config``) says ``compact``, which the broker's
  cleaner acts on (``log.cleaner.enable`` is true by default). Two cleaners on one
  partition would fight over the same ``.cleaned`` names and commit stale work.
- tiered logs: ``remote.storage.enable=true``, or a ``log-start-offset-checkpoint`` entry at
  or below the first local segment (Kafka writes an entry only when the log start is above
  the first segment, or for a log with remote storage). A merged segment would be uploaded
  again from its base, and remote storage would hold overlapping segments.

- files the broker could not open: the sidecar's uid is not the owner of the segments and
  what it writes would not get the owner's group (``stage.uid_refusal``).

Free disk is guarded where staging happens (``stage.free_disk_allows``,
``stage.evict_for_disk``).

Before any of that, ``mode_refusal`` decides whether a writing mode may run at all as this
process's uid (checked when the log dirs are first seen, and again when they or the mode
change): the files compact and stage modes write must be the broker's to open read-write.

At commit time, ``CommitCheck`` asks again, right before each set, whether the policy file and
the cluster's topic config *as they are now* still want it; a set they do not is discarded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cleaner.clock import SYSTEM_TIME
from cleaner.config import Mode, Policy
from cleaner.effective_config import EffectiveRule, effective_rule
from cleaner.engine.manager import LogCleanerManager, ManagedLog
from cleaner.errors import KafkaCleanerError
from cleaner.storage.cluster_metadata import ClusterMetadata, ClusterMetadataReader, find_metadata_dir
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.metadata import read_meta_properties
from cleaner.storage.topic_partition import TopicPartition

from . import stage
from .policy_watch import PolicyInForce
from .stage import Owner, StagedSet, Unwanted, uid_refusal


def stage_refusal(
    managed: ManagedLog,
    *,
    cleaner_checkpoint: Mapping[TopicPartition, int],
    log_start_checkpoint: Mapping[TopicPartition, int],
) -> str | None:
    """Why stage mode must not touch this partition, or None."""
    tp = managed.topic_partition
    if tp in cleaner_checkpoint:
        return "the broker compacts this partition itself (it is in cleaner-offset-checkpoint)"
    config = managed.config
    if config is not None and config.remote_storage:
        return "tiered storage (remote.storage.enable=true): a merged segment would be uploaded again"
    segments = managed.log.segments
    start = log_start_checkpoint.get(tp)
    if start is not None and segments and start <= segments[0].base_offset:
        return (
            f"a tiered log: log-start-offset-checkpoint holds {start}, at or below the first local segment "
            f"{segments[0].base_offset} (Kafka writes such an entry only for remote storage)"
        )
    if config is not None and config.cluster_compacts:
        return (
            "the cluster's topic config says cleanup.policy=compact: the broker's own cleaner compacts it "
            "(log.cleaner.enable defaults to true)"
        )
    return None


def mode_refusal(mode: Mode, log_dirs: Sequence[Path]) -> str | None:
    """Why ``mode`` must not run as this process's uid over ``log_dirs``, or None.

    The broker's files belong to its uid (Strimzi and Bitnami: 1001, Confluent: 1000); the
    owner of each log dir's first partition (its first segment) stands for the dir, the dir
    itself when it holds no partition yet. Kafka opens every segment and index read-write:

    - compact mode writes the cleaned segments (and the cleaner checkpoint) as this process,
      so it must *be* the owner; root is no exception (files owned by root are not the
      broker's to open);
    - stage mode hands what it stages to the owner (root) or to the owner's group (a member of
      it, e.g. through the pod's fsGroup): ``stage.uid_refusal`` decides, per partition too.

    Observe mode writes nothing and is never refused.
    """
    if mode is Mode.OBSERVE:
        return None
    euid = os.geteuid()
    for d in log_dirs:
        try:
            partitions = LogDirectory(d, read_only=True).partition_dirs()
            sample = next(iter(partitions.values()), None)
            if mode is Mode.COMPACT:
                owner = Owner.of(sample if sample is not None else d)
                if euid != owner.uid:
                    return (
                        f"compact mode refused: the sidecar runs as uid {euid}, but the broker's files in {d} "
                        f"belong to uid {owner.uid}, and the broker could not open the segments the sidecar "
                        f"would write. Run the sidecar as uid {owner.uid} (spec.sidecar.securityContext.runAsUser, "
                        "or the broker container's runAsUser, which the operator copies)"
                    )
            elif sample is not None:
                why = uid_refusal(sample)
                if why is not None:
                    return f"stage mode refused in {d}: {why}"
        except OSError as e:
            return f"{mode} mode refused: cannot tell who owns the broker's files in {d}: {e}"
    return None


def refusals(logs: Mapping[TopicPartition, ManagedLog]) -> dict[tuple[Path, TopicPartition], str]:
    """Every compacted partition of ``logs`` that stage mode refuses, with the reason."""
    out: dict[tuple[Path, TopicPartition], str] = {}
    checkpoints: dict[Path, tuple[dict[TopicPartition, int], dict[TopicPartition, int]]] = {}
    for tp, managed in logs.items():
        if not managed.compacted:
            continue
        d = managed.log_dir.path
        if d not in checkpoints:
            checkpoints[d] = (managed.log_dir.cleaner_checkpoint.read(), managed.log_dir.log_start_offsets())
        cleaned, starts = checkpoints[d]
        why = stage_refusal(managed, cleaner_checkpoint=cleaned, log_start_checkpoint=starts)
        if why is None:
            try:
                why = uid_refusal(managed.log.dir)
            except OSError as e:
                why = f"cannot tell who owns the partition's files: {e}"
        if why is not None:
            out[(d, tp)] = why
    return out


def stage_report(log_dirs: list[Path], policy: Policy) -> list[dict[str, Any]]:
    """One entry per compacted partition (and per stray staged set): its stage state."""
    manager = LogCleanerManager(
        [LogDirectory(d, read_only=True, may_stage=True) for d in log_dirs],
        policy,
        SYSTEM_TIME,
        write_checkpoints=False,
    )
    logs = manager.logs()
    refused = refusals(logs)
    out = []
    seen = set()
    for tp, managed in sorted(logs.items(), key=lambda kv: str(kv[0])):
        if not managed.compacted:
            continue
        key = (managed.log_dir.path, tp)
        seen.add(key)
        entry: dict[str, Any] = {"partition": str(tp), "logDir": str(managed.log_dir.path)}
        staged = stage.load(managed.log.dir)
        if staged is not None:
            why = stage.validate(staged, managed.log.dir)
            unwanted = config_unwanted(staged, managed.config) if why is None and managed.config else None
            if unwanted is not None:  # a commit would discard it
                why = unwanted.message
            entry.update(
                state="staged" if why is None else "stale",
                reason=why,
                baseOffset=staged.base_offset,
                nextOffset=staged.next_offset,
                stagedBytes=staged.staged_bytes,
                sourceBytes=staged.source_bytes,
            )
        elif key in refused:
            entry.update(state="refused", reason=refused[key])
        else:
            entry.update(state="none", reason=None)
        out.append(entry)
    for d in log_dirs:
        for tp, pdir in stage.staged_partitions(d).items():
            if (d, tp) not in seen and stage.load(pdir) is not None:
                out.append(
                    {
                        "partition": str(tp),
                        "logDir": str(d),
                        "state": "orphaned",
                        "reason": "the policy does not stage this topic: the sidecar deletes the set",
                    }
                )
    return out


def refusal_lines(log_dirs: list[Path], policy: Policy) -> list[str]:
    """What ``kafka-cleaner status`` prints under its table for a stage-mode policy."""
    return [
        f"{e['partition']}: {e['state']}" + (f" ({e['reason']})" if e.get("reason") else "")
        for e in stage_report(log_dirs, policy)
        if e["state"] != "none"
    ]


class CommitCheck:
    """Whether the policy and the cluster's topic config in force *now* still want a staged
    set (``stage.commit_log_dir``'s ``wanted``). Each call reads the policy file again
    (``PolicyInForce``) and brings the KRaft metadata on these disks up to date
    (``ClusterMetadataReader``, which reads only what was appended), then asks what staging
    asks (``LogCleanerManager.logs`` and ``stage_refusal``'s config checks):

    - the policy file is there, in stage mode and not paused;
    - a rule matches the topic, and the topic's effective ``cleanup.policy`` (the cluster's
      where it sets one) includes ``compact``;
    - the cluster does not compact the topic itself, nor keep it in remote storage;
    - the effective ``delete.retention.ms`` and ``min.compaction.lag.ms`` are those the set
      was cleaned under (``stage.RESULT_KEYS``), and the cluster's config is read now if it
      was read then (unreadable metadata must not pass for a config that did not change).
    """

    def __init__(self, policy_path: str | Path, log_dirs: Sequence[Path], last_good: Policy | None = None) -> None:
        self.policy = PolicyInForce(policy_path, last_good)
        self.log_dirs = list(log_dirs)
        self._reader: ClusterMetadataReader | None = None

    def _cluster(self) -> tuple[ClusterMetadata | None, int | None, str | None]:
        """(metadata, this broker's id, why it cannot be read)."""
        found = find_metadata_dir(self.log_dirs)
        if found is None:
            return None, None, None
        if self._reader is None or self._reader.dir != found:
            self._reader = ClusterMetadataReader(found)
        try:
            metadata = self._reader.refresh()
        except (KafkaCleanerError, OSError) as e:
            self._reader = None
            return None, None, str(e)
        try:
            broker_id = read_meta_properties(found.parent / "meta.properties").node_id
        except (KafkaCleanerError, OSError):
            broker_id = None
        return metadata, broker_id, None

    def __call__(self, tp: TopicPartition, staged: StagedSet) -> Unwanted | None:
        policy, why = self.policy.read()
        if policy is None:
            return Unwanted("policyGone", why or "no policy")
        if policy.mode is not Mode.STAGE:
            return Unwanted("notStageMode", f"the policy is in {policy.mode} mode now, not stage")
        if policy.paused:
            return Unwanted("paused", "the policy is paused")
        rule = policy.rule_for(tp.topic)
        if rule is None:
            return Unwanted("noRule", f"no rule of the policy matches the topic {tp.topic} any more")
        cluster, broker_id, error = self._cluster()
        config = effective_rule(rule, cluster.topic(tp.topic, broker_id) if cluster is not None else None)
        if not config.rule.compact:
            whose = "the cluster's" if config.sources.get("cleanup.policy") == "cluster" else "the rule's"
            now_policy = config.rule.cleanup_policy
            return Unwanted("notCompacted", f"the topic's cleanup.policy is now {now_policy} ({whose}): not compacted")
        if config.cluster_compacts:
            return Unwanted(
                "brokerCompacts",
                "the cluster's topic config says cleanup.policy=compact now: the broker's own cleaner compacts it",
            )
        if config.remote_storage:
            return Unwanted("tiered", "the cluster's topic config says remote.storage.enable=true now")
        return config_unwanted(staged, config, error)


def config_unwanted(staged: StagedSet, config: EffectiveRule, cluster_error: str | None = None) -> Unwanted | None:
    """Why the topic's effective config in force (``config``) no longer wants ``staged``:
    a config that changes the result (``stage.RESULT_KEYS``) is not what the set was cleaned
    under, or the cluster's config was read then and cannot be now; None if it still does."""
    then = staged.cleaned_under
    if not then:
        return Unwanted(
            "notRecorded", "the set does not record the config it was cleaned under (staged by an older version)"
        )
    now = stage.cleaned_under_of(config.rule, config)
    if then.get("clusterConfig") and not now["clusterConfig"]:
        because = f": {cluster_error}" if cluster_error else " (no metadata log among the log dirs)"
        return Unwanted(
            "configChanged", f"the set was cleaned under the cluster's topic config, which cannot be read now{because}"
        )
    changed = [f"{k} is {now[k]} now, the set was cleaned under {then.get(k)}" for k in stage.RESULT_KEYS
               if then.get(k) != now[k]]  # fmt: skip
    return Unwanted("configChanged", "; ".join(changed)) if changed else None
