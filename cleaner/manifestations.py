"""Which of the compaction–replication race's four manifestations a replica has, and on which
keys or transactions (issue 24, item 4; docs/replica-divergence.md).

A replica that was away while the leader's cleaner removed a tombstone or a transaction marker
never receives it. What it then serves differs from what an in-sync replica serves in ways
compaction alone never produces, and each way is one manifestation. Both replicas' logs are
read (read-only, safe next to live brokers); for every key, what a ``read_committed`` consumer
is served: the key's latest record that is neither in an aborted transaction (the replica's own
``.txnindex``, which Kafka's fetch hands to read_committed consumers) nor in a transaction still
open on that replica. Compaction removes superseded records, aborted data and, past their
horizons, tombstones and markers, but never changes what a key's latest served record says, so
in-sync replicas agree on it key by key. On the replica being judged (the *suspect*; the other
is the *in-sync* one, e.g. the leader):

1. **Deleted data reappears**: the suspect serves a value the in-sync replica no longer holds,
   with no record of the key after it there: its deletion (a tombstone) was removed before the
   suspect fetched it. Named for a record outside transactions. (Once the suspect's own cleaner
   has removed a deletion it held as aborted, manifestation 3 leaves this same log; the finding
   says so.)
2. **Aborted data served as committed**: the same for a record of a transaction the suspect
   counts as committed: the in-sync replica removed it as aborted data and its ABORT before the
   suspect fetched them, and a later COMMIT of the producer closed the suspect's open
   transaction. (A committed value whose later tombstone was lost leaves the same two logs; the
   finding says so. It also names the in-sync replica serving an older value of the key, which
   only aborted data explains.)
3. **Committed data hidden as aborted**: the suspect hides, in an aborted transaction of its
   own, a record the in-sync replica serves or that deleted the value the suspect serves
   instead: the COMMIT was removed before the suspect fetched it and a later ABORT closed the
   transaction.
4. **read_committed frozen at a stale last stable offset**: a transaction open on the suspect
   whose first batch the in-sync replica no longer holds (it removed the data as ended): the
   suspect's last stable offset stays there and read_committed consumers get nothing after it.

Only records below both replicas' high watermarks are judged (a record the suspect has not
fetched yet is lag, not divergence), and none below the in-sync replica's log start (retention
runs on each broker at times of its own). Keys are compared by digest (the offset map's xxh3-128),
a slice of the key space at a time: memory is bounded by ``max_keys``, not by the log; a
partition with more keys is read once per slice. Not judged: legacy (v0/v1) batches, which
are skipped (a log of brokers before 0.11: no transactions, and its values and tombstones
are not compared), and divergent history, which the operator's replica comparison names
(``divergentBatch``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import numpy as np

from cleaner.commands import exit_codes_for_errors
from cleaner.engine.offset_map import digest_keys
from cleaner.engine.transactions import control_types
from cleaner.errors import KafkaCleanerError
from cleaner.output import Column, output_option, print_table, resolve_format
from cleaner.records.columns import decode_records
from cleaner.records.control import ControlRecordType
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.metadata import read_meta_properties
from cleaner.storage.topic_partition import TopicPartition

__all__ = ["DEFAULT_MAX_KEYS", "NAMES", "Finding", "Replica", "compare"]

NAMES = {
    1: "deleted data reappears",
    2: "aborted data served as committed",
    3: "committed data hidden as aborted",
    4: "read_committed frozen at a stale LSO",
}
#: Keys held per slice of the key space (about 60 bytes each on both replicas; besides them,
#: up to ``_MERGE_ROWS`` records gathered before each merge).
DEFAULT_MAX_KEYS = 4_000_000
EXIT_DIVERGED = 1
#: Findings kept per manifestation (the first by offset); the count says how many there were.
MAX_FINDINGS = 1000

_VISIBLE, _ABORTED, _OPEN = 0, 1, 2


class ReplicaUnreadable(KafkaCleanerError):
    """A replica's copy of the partition is missing or cannot be read."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One manifestation on the suspect replica."""

    manifestation: int
    topic: str
    partition: int
    replica: str
    offset: int
    """The record's offset (1-3) or the open transaction's first offset (4), on ``replica``."""
    key: bytes | None
    producer_id: int | None
    detail: str

    @property
    def name(self) -> str:
        return NAMES[self.manifestation]


@dataclasses.dataclass(frozen=True)
class Replica:
    """One broker's copy of the partition: its log dirs and a name for it in the findings."""

    name: str
    log_dirs: tuple[Path, ...]


@dataclasses.dataclass
class _Read:
    """What is known of one replica once its batch headers are read."""

    log: Log
    log_start: int
    high_watermark: int
    aborted: dict[int, tuple[np.ndarray, np.ndarray]]
    """Producer id -> (first offsets, last offsets) of its aborted transactions, as its txn index says."""
    open_txns: dict[int, int]
    """Producer id -> first offset of its transaction still open (no marker below the high watermark)."""


class _TooManyKeys(Exception):
    pass


def _open(replica: Replica, tp: TopicPartition) -> _Read:
    dirs = [LogDirectory(d, read_only=True) for d in replica.log_dirs]
    found = [d for d in dirs if (d.path / tp.dir_name).is_dir()]
    if not found:
        raise ReplicaUnreadable(f"{replica.name}: {tp} is not on {', '.join(map(str, replica.log_dirs))}")
    d = found[0]
    log = d.open_log(tp, LogConfig(), log_start_offset=d.log_start_offsets().get(tp))
    hw = min(d.high_watermarks().get(tp, log.log_end_offset), log.log_end_offset)
    aborted: dict[int, tuple[list[int], list[int]]] = {}
    for txn in log.collect_aborted_transactions(log.log_start_offset, hw):
        firsts, lasts = aborted.setdefault(txn.producer_id, ([], []))
        firsts.append(txn.first_offset)
        lasts.append(txn.last_offset)
    open_txns: dict[int, int] = {}
    for chunk in _transaction_chunks(log, hw):
        controls = control_types(chunk)
        for i in np.flatnonzero(chunk.is_transactional).tolist():
            producer = int(chunk.producer_ids[i])
            if chunk.is_control[i]:
                if controls.get(i) in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
                    open_txns.pop(producer, None)
            else:
                open_txns.setdefault(producer, int(chunk.base_offsets[i]))
    return _Read(log, log.log_start_offset, hw,
                 {p: (np.array(f, dtype=np.int64), np.array(la, dtype=np.int64)) for p, (f, la) in aborted.items()},
                 open_txns)  # fmt: skip


def _chunks(log: Log, below: int) -> Iterator:  # type: ignore[type-arg]
    """The log's v2 batches below ``below``, a bounded chunk at a time."""
    for chunk in log.iter_batches(log.log_start_offset):
        keep = chunk.is_v2 & (chunk.base_offsets < below)
        if not keep.any():
            if (chunk.base_offsets >= below).any():
                return
            continue
        yield chunk if keep.all() else chunk.select(keep)


def _transaction_chunks(log: Log, below: int) -> Iterator:  # type: ignore[type-arg]
    """The log's transactional and control batches below ``below``, read header by header
    (``LogSegment.transaction_batches``: the control batches whole, the others' headers)."""
    for segment in log.segments:
        if segment.base_offset >= below:
            return
        for chunk in segment.transaction_batches():
            keep = chunk.base_offsets < below
            if keep.any():
                yield chunk if keep.all() else chunk.select(keep)


def _batch_states(read: _Read, chunk) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Each batch's state for read_committed: visible, aborted or in a transaction open here."""
    states = np.zeros(len(chunk), dtype=np.int8)
    for i in np.flatnonzero(chunk.is_transactional & ~chunk.is_control).tolist():
        producer, base = int(chunk.producer_ids[i]), int(chunk.base_offsets[i])
        if producer in read.open_txns and base >= read.open_txns[producer]:
            states[i] = _OPEN
        elif producer in read.aborted:
            firsts, lasts = read.aborted[producer]
            j = int(np.searchsorted(firsts, base, side="right")) - 1  # a producer's are disjoint
            if j >= 0 and base <= lasts[j]:
                states[i] = _ABORTED
    return states


#: Rows gathered before they are merged into the keys held (the merge sorts everything held).
_MERGE_ROWS = 1 << 20


@dataclasses.dataclass
class _Latest:
    """Per key digest, its latest record of one kind: offset, whether a tombstone, whether
    transactional, its producer. Kept sorted by digest once ``settle`` has run; rows are
    gathered (``add``) and merged when they are as many as the keys held, so each row is
    sorted a bounded number of times."""

    max_keys: int = DEFAULT_MAX_KEYS
    digests: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 2), dtype=np.uint64))
    offsets: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tombstones: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))
    transactional: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))
    producers: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _pending: list[tuple[np.ndarray, ...]] = dataclasses.field(default_factory=list)
    _pending_rows: int = 0

    def add(self, digests, offsets, tombstones, transactional, producers) -> None:  # type: ignore[no-untyped-def]
        self._pending.append((digests, offsets, tombstones, transactional, producers))
        self._pending_rows += len(offsets)
        if self._pending_rows >= max(len(self.offsets), _MERGE_ROWS):
            self.settle()

    def settle(self) -> None:
        """Merge the gathered rows into the keys held (_TooManyKeys past ``max_keys``)."""
        if not self._pending:
            return
        held = (self.digests, self.offsets, self.tombstones, self.transactional, self.producers)
        d, o, t, x, p = (np.concatenate([h, *(rows[i] for rows in self._pending)]) for i, h in enumerate(held))
        self._pending, self._pending_rows = [], 0
        order = np.lexsort((-o, d[:, 1], d[:, 0]))  # by digest, the latest first
        d = d[order]
        first = np.ones(len(d), dtype=bool)
        first[1:] = (d[1:] != d[:-1]).any(axis=1)
        keep = order[first]
        if len(keep) > self.max_keys:
            raise _TooManyKeys
        self.digests, self.offsets = d[first], o[keep]
        self.tombstones, self.transactional, self.producers = t[keep], x[keep], p[keep]

    def lookup(self, digests: np.ndarray) -> np.ndarray:
        """Index of each digest here, or -1."""
        if not len(self.digests):
            return np.full(len(digests), -1, dtype=np.int64)
        keys = self.digests.view([("a", np.uint64), ("b", np.uint64)]).ravel()
        wanted = np.ascontiguousarray(digests).view([("a", np.uint64), ("b", np.uint64)]).ravel()
        at = np.searchsorted(keys, wanted)
        at_clipped = np.minimum(at, len(keys) - 1)
        return np.where(keys[at_clipped] == wanted, at_clipped, -1)


def _digests(cols, rows: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The rows' key digests (xxh3-128) as (n, 2) uint64: two integers compare faster than 16 bytes."""
    starts, ends = cols.key_spans(rows)
    return np.ascontiguousarray(digest_keys(cols.data, starts, ends)).view(np.uint64)


def _scan_keys(read: _Read, below: int, slices: int, part: int, max_keys: int) -> tuple[_Latest, _Latest]:
    """The latest record served per key, and the latest record hidden as aborted per key,
    of the keys whose digest falls in slice ``part`` of ``slices``, among records below ``below``."""
    served, hidden = _Latest(max_keys), _Latest(max_keys)
    for chunk in _chunks(read.log, below):
        data = ~chunk.is_control
        if not data.any():
            continue
        states = _batch_states(read, chunk)[data]
        batches = chunk.select(data)
        cols = decode_records(batches)
        rows = np.flatnonzero(cols.has_key & (cols.offsets < below))
        if not len(rows):
            continue
        digests = _digests(cols, rows)
        mine = digests[:, 0] % np.uint64(slices) == np.uint64(part)
        rows, digests = rows[mine], digests[mine]
        batch_of = cols.batch[rows]
        state = states[batch_of]
        args = (cols.offsets[rows], cols.is_tombstone[rows], batches.is_transactional[batch_of],
                batches.producer_ids[batch_of].astype(np.int64))
        for latest, wanted in ((served, state == _VISIBLE), (hidden, state == _ABORTED)):
            if wanted.any():
                latest.add(digests[wanted], *(a[wanted] for a in args))
    served.settle()
    hidden.settle()
    return served, hidden


def _ended_here(read: _Read, open_txns: dict[int, int], fetched_up_to: int) -> dict[int, int]:
    """Of the transactions open on another replica (producer -> first offset), those this
    replica has ended for good: it holds no batch at their first offset, and no marker of
    their producer at or after ``fetched_up_to`` (which the other replica would still fetch)."""
    firsts = np.array(sorted(open_txns.values()), dtype=np.int64)
    held: set[int] = set()
    later_marker: set[int] = set()
    for chunk in _transaction_chunks(read.log, read.high_watermark):
        i = np.searchsorted(chunk.base_offsets, firsts, side="right") - 1
        at = np.maximum(i, 0)  # an emptied batch (a header the cleaner kept) tells a fetcher nothing
        inside = (i >= 0) & (firsts <= chunk.last_offsets[at]) & (chunk.records_counts[at] > 0)
        held.update(firsts[inside].tolist())
        markers = chunk.is_control & (chunk.base_offsets >= fetched_up_to)
        later_marker.update(chunk.producer_ids[markers].tolist())
    return {p: f for p, f in open_txns.items() if f not in held and p not in later_marker}


def compare(in_sync: Replica, suspect: Replica, tp: TopicPartition, *,
            max_keys: int = DEFAULT_MAX_KEYS) -> tuple[list[Finding], dict[int, int]]:
    """The manifestations on ``suspect`` against ``in_sync``: the findings (at most
    :data:`MAX_FINDINGS` per manifestation, by offset) and how many of each there were."""
    a, b = _open(in_sync, tp), _open(suspect, tp)
    try:
        below = min(a.high_watermark, b.high_watermark)
        counts = dict.fromkeys(NAMES, 0)
        findings: list[Finding] = []

        def found(m: int, offset: int, digest: np.ndarray | None, producer: int | None, detail: str) -> None:
            counts[m] += 1
            findings.append(Finding(m, tp.topic, tp.partition, suspect.name, offset,
                                    None if digest is None else bytes(digest.tobytes()), producer, detail))

        # 4: transactions open on the suspect whose first batch the in-sync replica has removed.
        candidates = {p: f for p, f in b.open_txns.items() if a.log_start <= f < below}
        for producer, first in sorted(_ended_here(a, candidates, b.high_watermark).items(), key=lambda pf: pf[1]):
            found(4, first, None, producer,
                  f"producer {producer}'s transaction is open on {suspect.name} from offset {first}; "
                  f"{in_sync.name} holds none of it and no later marker of the producer (it ended there)")

        slices = 1
        while True:
            try:
                keyed = [f for s in range(slices) for f in _key_findings(a, b, below, slices, s, max_keys,
                                                                           in_sync.name, suspect.name)]
                break
            except _TooManyKeys:
                slices *= 2
        for m, offset, digest, producer, detail in keyed:
            found(m, offset, digest, producer, detail)
        findings.sort(key=lambda f: (f.manifestation, f.offset))
        kept: list[Finding] = []
        for m in NAMES:
            kept += [f for f in findings if f.manifestation == m][:MAX_FINDINGS]
        return _with_keys(b, below, kept), counts
    finally:
        a.log.close()
        b.log.close()


def _key_findings(a: _Read, b: _Read, below: int, slices: int, part: int, max_keys: int,
                  a_name: str, b_name: str) -> list[tuple[int, int, np.ndarray, int | None, str]]:
    """Manifestations 1-3, key by key, for one slice of the key space."""
    a_served, _ = _scan_keys(a, a.high_watermark, slices, part, max_keys)  # a newer record past `below`: lag
    b_served, b_hidden = _scan_keys(b, below, slices, part, max_keys)
    out = []
    in_a = a_served.lookup(b_served.digests)
    hidden_at = b_hidden.lookup(b_served.digests)
    for i in range(len(b_served.digests)):
        offset = int(b_served.offsets[i])
        if b_served.tombstones[i] or offset < a.log_start:
            continue
        j = int(in_a[i])
        a_offset = int(a_served.offsets[j]) if j >= 0 else -1
        if a_offset == offset or a_offset >= below:
            continue
        digest, producer = b_served.digests[i], int(b_served.producers[i])
        h = int(hidden_at[i])
        if h >= 0 and int(b_hidden.offsets[h]) > offset and (a_offset < 0 or a_offset > offset):
            # The suspect hides a later record of the key as aborted; the in-sync replica does not.
            hp = int(b_hidden.producers[h])
            out.append((3, int(b_hidden.offsets[h]), digest, hp,
                        f"{b_name} hides the record at offset {int(b_hidden.offsets[h])} as aborted (producer {hp}) "
                        f"and serves the older one at offset {offset}; {a_name} "
                        + ("serves the newer one" if a_offset > offset else "serves neither")))
        elif a_offset < 0 or (a_served.tombstones[j] and a_offset > offset):
            if b_served.transactional[i]:
                out.append((2, offset, digest, producer,
                            f"{b_name} serves the value at offset {offset} as committed (producer {producer}); "
                            f"{a_name} has removed it with nothing newer for the key (aborted there, or a "
                            f"committed value whose later tombstone was removed: manifestation 1)"))
            else:
                out.append((1, offset, digest, None,
                            f"{b_name} serves the value at offset {offset}; {a_name} has removed it and its "
                            f"deletion (or {b_name} held a committed deletion as aborted and its own cleaner "
                            f"has since removed it: manifestation 3, which leaves the same log)"))
        elif a_offset < offset and b_served.transactional[i]:
            out.append((2, offset, digest, producer,
                        f"{b_name} serves the value at offset {offset} as committed (producer {producer}); "
                        f"{a_name} serves the older value at offset {a_offset}: it aborted the newer one"))
    # The suspect hides, as aborted, a key's latest record the in-sync replica serves.
    in_a = a_served.lookup(b_hidden.digests)
    in_b = b_served.lookup(b_hidden.digests)
    for i in range(len(b_hidden.digests)):
        offset, j, k = int(b_hidden.offsets[i]), int(in_a[i]), int(in_b[i])
        if j >= 0 and int(a_served.offsets[j]) == offset and k < 0:
            producer = int(b_hidden.producers[i])
            out.append((3, offset, b_hidden.digests[i], producer,
                        f"{b_name} hides the record at offset {offset} as aborted (producer {producer}) and serves "
                        f"nothing for the key; {a_name} serves it"))
    return out


def _with_keys(read: _Read, below: int, findings: list[Finding]) -> list[Finding]:
    """The findings with each key's bytes in place of its digest (read back from the suspect)."""
    keyed = [np.frombuffer(f.key, dtype=np.uint64) for f in findings if f.key is not None]
    if not keyed:
        return findings
    unique = np.unique(np.array(keyed), axis=0)
    wanted = _Latest(digests=unique)  # np.unique sorts rows as _Latest keeps them
    digests = [bytes(d.tobytes()) for d in unique]
    keys: dict[bytes, bytes] = {}
    for chunk in _chunks(read.log, below):
        data = ~chunk.is_control
        if not data.any():
            continue
        cols = decode_records(chunk.select(data))
        rows = np.flatnonzero(cols.has_key)
        if not len(rows):
            continue
        at = wanted.lookup(_digests(cols, rows))
        for r, j in zip(rows[at >= 0].tolist(), at[at >= 0].tolist(), strict=True):
            keys.setdefault(digests[j], bytes(cols.key(r) or b""))
        if len(keys) == len(digests):
            break
    return [dataclasses.replace(f, key=keys.get(f.key)) if f.key is not None else f for f in findings]


def _replica(log_dirs: tuple[Path, ...], fallback: str) -> Replica:
    """The replica of these log dirs, named by the broker's node.id where meta.properties says it."""
    for d in log_dirs:
        try:
            node = read_meta_properties(d).node_id
        except (OSError, KafkaCleanerError):
            continue
        if node is not None:
            return Replica(f"broker {node}", log_dirs)
    return Replica(fallback, log_dirs)


def _shown(key: bytes | None) -> str:
    if key is None:
        return "-"
    text = key.decode("utf-8", "replace")
    return text if text.isprintable() and "\ufffd" not in text else "0x" + key.hex()


@click.command("diverged")
@click.option("--in-sync", "in_sync", required=True, multiple=True, type=click.Path(path_type=Path, exists=True),
              help="A log dir of a replica known to be in sync (the leader); repeat for each of its log dirs.")
@click.option("--replica", required=True, multiple=True, type=click.Path(path_type=Path, exists=True),
              help="A log dir of the replica to judge; repeat for each of its log dirs.")
@click.option("--topic", required=True, help="The topic's exact name.")
@click.option("--partition", "partitions", required=True, multiple=True, type=click.IntRange(min=0),
              help="A partition to compare; repeat for more.")
@click.option("--max-keys", default=DEFAULT_MAX_KEYS, show_default=True, type=click.IntRange(min=1),
              help="Keys held at once per replica; a partition with more is read once per slice of its keys.")
@output_option
def diverged_command(in_sync: tuple[Path, ...], replica: tuple[Path, ...], topic: str, partitions: tuple[int, ...],
                     max_keys: int, output: str | None, as_json: bool) -> None:
    """Which of the compaction–replication race's four manifestations the replica has, against
    a replica in sync, with the keys and transactions affected (docs/replica-divergence.md):
    1 deleted data reappears, 2 aborted data served as committed, 3 committed data hidden as
    aborted, 4 read_committed frozen at a stale LSO. Read-only, safe next to live brokers.
    Exit 0 when the replicas agree, 1 when the replica has any (repair: kafka-cleaner refetch)."""
    reference, suspect = _replica(in_sync, "in-sync"), _replica(replica, "replica")
    if reference.name == suspect.name:  # copies of one broker's dirs: name them by path
        reference = Replica(f"{reference.name} ({in_sync[0]})", in_sync)
        suspect = Replica(f"{suspect.name} ({replica[0]})", replica)
    findings: list[Finding] = []
    counts = dict.fromkeys(NAMES, 0)
    with exit_codes_for_errors():
        for p in partitions:
            got, n = compare(reference, suspect, TopicPartition(topic, p), max_keys=max_keys)
            findings += got
            counts = {m: counts[m] + n[m] for m in NAMES}
    fmt = resolve_format(output, as_json)
    if fmt == "json":
        click.echo(json.dumps([{**dataclasses.asdict(f), "key": None if f.key is None else f.key.hex(),
                                "name": f.name} for f in findings], indent=2))
    elif findings:
        columns = [Column("#", right=True), Column("MANIFESTATION"), Column("REPLICA"), Column("PARTITION"),
                   Column("OFFSET", right=True), Column("KEY"), Column("PRODUCER", right=True),
                   Column("DETAIL", drop=1)]
        print_table(fmt, "diverged", columns, [
            [str(f.manifestation), f.name, f.replica, f"{f.topic}-{f.partition}", str(f.offset), _shown(f.key),
             "-" if f.producer_id is None else str(f.producer_id), f.detail] for f in findings])
    total = sum(counts.values())
    if not total:
        click.echo(f"diverged: {suspect.name} agrees with {reference.name} on {topic} "
                   f"{', '.join(map(str, partitions))}", err=True)
        return
    shown = ", ".join(f"{counts[m]} x {m} ({NAMES[m]})" for m in NAMES if counts[m])
    click.echo(f"diverged: {suspect.name} against {reference.name}: {shown}; repair: stop {suspect.name} and "
               f"run kafka-cleaner refetch (docs/runbooks.md)", err=True)
    sys.exit(EXIT_DIVERGED)
