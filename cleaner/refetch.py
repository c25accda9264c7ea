"""``kafka-cleaner refetch``: repair a diverged replica the way Kafka can, by making the stopped
broker fetch the partition again from its leader (issue 24, item 4; docs/replica-divergence.md).

A replica that was away past a tombstone's or marker's delete horizon can hold what the leader
removed (the compaction-replication race). Kafka has no command to resynchronise it, but it has
a way: a partition directory named ``<topic>-<p>.<uuid>-delete`` is one a broker deletes at
start-up (``LogManager.loadLog`` schedules it; about a minute after the start in the tests), and a partition
the metadata assigns to the broker and for which it has no log is created empty and fetched
from the leader, from the leader's log start on (``ReplicaFetcherThread``, truncating to the
leader's log start on ``OFFSET_OUT_OF_RANGE``). So the repair is Kafka's own topic-deletion
rename of one partition directory, with the broker stopped (its ``.lock`` taken here).

It is safe only if another replica has every committed record: this refuses unless the
metadata on the broker's disk (as the broker last replicated it) shows another broker, not
fenced, in the partition's ISR. Were this broker the last in-sync replica, an empty log would
be elected leader and every record lost. The metadata is as of the broker's stop: the command
prints its age, and a person on call checks the ISR live (``kafka-topics.sh --describe``) before
``--execute``. Without ``--execute`` it changes nothing.
"""

from __future__ import annotations

import datetime
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import click

from cleaner.commands import EXIT_USAGE, exit_codes_for_errors, log_dir_argument
from cleaner.errors import KafkaCleanerError
from cleaner.storage import files
from cleaner.storage.cluster_metadata import find_metadata_dir, read_cluster_metadata
from cleaner.storage.lock import LogDirLock
from cleaner.storage.metadata import read_meta_properties
from cleaner.storage.topic_partition import TopicPartition

DELETE_DIR_SUFFIX = "-delete"
MAX_DIR_NAME = 255


class RefetchRefused(KafkaCleanerError):
    """Setting the replica aside would not be safe, or there is nothing to set aside."""


@dataclass(frozen=True)
class Plan:
    """What ``refetch`` would do, and the facts it judged safety by."""

    partition_dir: Path
    delete_dir: Path
    broker: int
    isr: tuple[int, ...]
    leader: int
    metadata_age_ms: int


def delete_dir_name(tp: TopicPartition) -> str:
    """Kafka's name for a partition directory to delete (``UnifiedLog.logDeleteDirName``): the
    topic cut so that ``<topic>-<p>.<uuid without dashes>-delete`` fits in 255 bytes."""
    suffix = f".{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
    room = MAX_DIR_NAME - len(suffix) - len(f"-{tp.partition}")
    return f"{tp.topic[:room]}-{tp.partition}{suffix}"


def plan(log_dirs: list[Path], tp: TopicPartition, now_ms: int) -> Plan:
    """Where the partition is, and whether another replica is in sync (else RefetchRefused)."""
    found = [d / f"{tp.topic}-{tp.partition}" for d in log_dirs if (d / f"{tp.topic}-{tp.partition}").is_dir()]
    if not found:
        raise RefetchRefused(f"{tp} is not on {', '.join(map(str, log_dirs))}: nothing to fetch again")
    if len(found) > 1:
        raise RefetchRefused(f"{tp} is in two log dirs ({found[0]}, {found[1]}): Kafka refuses to start on that")
    metadata_dir = find_metadata_dir(log_dirs)
    if metadata_dir is None:
        raise RefetchRefused(
            "no __cluster_metadata-0 on these log dirs (give the broker's metadata.log.dir too; a ZooKeeper-mode "
            "broker is not supported): without it nothing says another replica is in sync"
        )
    try:
        broker = read_meta_properties(metadata_dir.parent).node_id
    except OSError as e:
        raise RefetchRefused(f"{metadata_dir.parent}/meta.properties: {e.strerror}: the broker is unknown") from e
    if broker is None:
        raise RefetchRefused(f"{metadata_dir.parent}/meta.properties names no node.id")
    cluster = read_cluster_metadata(metadata_dir)
    replication = cluster.replication(tp.topic, tp.partition)
    if replication is None:
        raise RefetchRefused(f"the metadata on this disk does not know {tp}: Kafka would not fetch it again")
    if broker not in replication.replicas:
        raise RefetchRefused(f"broker {broker} is not a replica of {tp} (replicas {list(replication.replicas)})")
    offline = {o.broker for o in replication.out_of_sync if o.offline}
    others = [b for b in replication.isr if b != broker and b not in offline]
    if not others:
        raise RefetchRefused(
            f"no other replica of {tp} is in sync (ISR {list(replication.isr)}, offline {sorted(offline)}): this "
            f"copy may hold committed records no other broker has, and an empty one could be elected leader"
        )
    age = max(now_ms - cluster.last_record_ms, 0) if cluster.last_record_ms >= 0 else -1
    [partition_dir] = found
    return Plan(partition_dir, partition_dir.parent / delete_dir_name(tp), broker, replication.isr,
                replication.leader, age)


def set_aside(p: Plan) -> None:
    """Kafka's deletion rename, under the log dir's ``.lock`` (the broker must be stopped)."""
    with LogDirLock(p.partition_dir.parent):
        files.rename(p.partition_dir, p.delete_dir)
        files.fsync_dir(p.partition_dir.parent)


def _age(ms: int) -> str:
    return "unknown" if ms < 0 else str(datetime.timedelta(seconds=ms // 1000))


@click.command("refetch")
@log_dir_argument
@click.option("--topic", required=True, help="The topic's exact name.")
@click.option("--partition", required=True, type=click.IntRange(min=0), help="The partition to fetch again.")
@click.option("--execute", is_flag=True, help="Act (without it: say what would be done and why, change nothing).")
def refetch_command(data_dir: tuple[Path, ...], topic: str, partition: int, execute: bool) -> None:
    """Make a stopped broker fetch one partition again from its leader: its copy is renamed
    as Kafka renames a deleted partition (<topic>-<p>.<uuid>-delete, removed at the broker's
    next start), and the broker's next start creates the partition empty and fetches the
    leader's log. For a replica that diverged (docs/replica-divergence.md). Give every log dir
    of the broker, its metadata.log.dir included. Refuses (exit 2) unless the metadata on the
    disk shows another broker in sync; exit 4 while a broker holds the log dir. Without
    --execute nothing changes."""
    tp = TopicPartition(topic, partition)
    now_ms = int(datetime.datetime.now(datetime.UTC).timestamp() * 1000)
    with exit_codes_for_errors():
        p = plan(list(data_dir), tp, now_ms)
    click.echo(f"{tp} on broker {p.broker}: {p.partition_dir}")
    click.echo(f"  in sync elsewhere: ISR {list(p.isr)}, leader {p.leader}, as of this disk's metadata, "
               f"{_age(p.metadata_age_ms)} old (check it live: kafka-topics.sh --describe --topic {topic})")
    if not execute:
        click.echo(f"  would rename it to {p.delete_dir.name}; run again with --execute to do it")
        return
    with exit_codes_for_errors():
        try:
            set_aside(p)
        except OSError as e:
            click.echo(f"kafka-cleaner: {p.partition_dir}: {e.strerror}", err=True)
            sys.exit(EXIT_USAGE)
    click.echo(f"  renamed to {p.delete_dir.name}: start the broker; it fetches {tp} from the leader")
