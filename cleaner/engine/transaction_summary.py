"""A segment's effect on the cleaner's transaction state, found where the segment is and
composed in log order elsewhere: the Spark driver learns the state at every segment and group
boundary of a round from what its tasks tell it, without reading a batch itself (issue 28).

Why it composes. Every step of ``CleanedTransactionMetadata`` concerns one producer. A
transactional batch or a marker of producer P reads and changes P's two facts: whether P is
in a committed transaction, and P's ongoing aborted transaction (whether a batch of it has
been seen). Consuming an aborted transaction of P sets P's second fact if it is unset. An
aborted transaction is consumed at the first replayed batch whose last offset reaches its
first offset; replayed batches come in offset order, so it is consumed before a batch of P
exactly when that batch's last offset reaches it, whichever batch consumed it. So what a
segment does to P is a function of P's two facts at the segment's start, and the segment
holds one such function per producer it touches. Its reader replays the segment's headers
once for each of the six start states (every producer in the same one) and records where
each producer ends; the composing side looks up each producer's own start state.

One thing is not per producer: the aborted transactions waiting to be consumed. Those left
when a segment starts begin below it, as do those its caller adds for it that begin at or
below its first replayed batch: all are consumed at that batch. The composing side consumes
them itself, up to that batch, before it applies the functions; the reader's replay holds
only the aborted transactions that begin after that batch and no later than the segment's
last replayed batch, the only others the segment consumes, and names them, so that the
composing side takes them out of its own queue. Should the two lists differ (a ``.txnindex``
no broker writes), the composing side reads that segment itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cleaner.storage.index import AbortedTxn
from cleaner.storage.log import Log
from cleaner.storage.segment import LogSegment

from .transactions import CleanedTransactionMetadata, ProducerFacts, control_types, run_transactions

START_STATES: tuple[ProducerFacts, ...] = tuple(
    ProducerFacts(committed, aborted, observed)
    for committed in (False, True)
    for aborted, observed in ((False, False), (True, False), (True, True))
)
"""A producer's facts at a segment's start, as far as the state machine can tell them apart:
in a committed transaction or not; no ongoing aborted transaction, one with no batch seen, or
one with a batch seen."""


@dataclass(frozen=True)
class ProducerEnd:
    """A producer's facts at a segment's end, for one start state: ``aborted`` is None (no
    ongoing aborted transaction), ``KEPT`` (the one it started with) or the transaction it
    consumed in the segment; ``observed`` is the last offset of the latest batch of it seen,
    None, or ``KEPT`` (the start's)."""

    committed: bool
    aborted: AbortedTxn | str | None
    observed: int | str | None


KEPT = "kept"


@dataclass(frozen=True)
class SegmentTransactions:
    """What replaying a segment's headers from ``position`` does to the transaction state."""

    base_offset: int
    position: int
    first_last_offset: int | None
    """The last offset of the first replayed batch (None: the segment has no transactional or
    control batch from ``position``)."""
    last_offset: int | None
    """The last offset of the last replayed batch."""
    consumed: tuple[AbortedTxn, ...]
    """The aborted transactions beginning after the first replayed batch and no later than
    the last, which the replay consumed."""
    ends: dict[int, tuple[ProducerEnd, ...]]
    """Per producer touched, its end for each of ``START_STATES``."""


Summaries = dict[tuple[int, int], SegmentTransactions]
"""Summaries by (segment base offset, position)."""


def summaries_needed(log: Log, first_dirty_offset: int, end_offset: int) -> list[tuple[int, int]]:
    """The (base offset, position) of every summary a round of ``log`` below ``end_offset``
    composes: each segment's from its start (the groups, from the log start), and the first
    dirty segment's from the first dirty offset (the map build)."""
    wanted = [(s.base_offset, 0) for s in log.segments if s.base_offset < end_offset]
    dirty = log.segments_between(first_dirty_offset, end_offset)
    if dirty:
        wanted.append((dirty[0].base_offset, dirty[0].lookup_position(first_dirty_offset)))
    return sorted(set(wanted))


def summarize(
    log: Log, segment: LogSegment, position: int = 0, throttle: Callable[[int], None] | None = None
) -> SegmentTransactions:
    """The summary of ``segment`` of ``log`` replayed from ``position`` (header-only:
    ``LogSegment.transaction_batches``; the chunks are held for the six replays, a few bytes
    a transactional batch)."""
    chunks = list(segment.transaction_batches(position, throttle))
    chunks = [c for c in chunks if len(c)]
    if not chunks:
        return SegmentTransactions(segment.base_offset, position, None, None, (), {})
    types = [control_types(c) for c in chunks]
    first, last = int(chunks[0].last_offsets[0]), int(chunks[-1].last_offsets[-1])
    consumed = tuple(t for t in log.collect_aborted_transactions(first + 1, last + 1) if first < t.first_offset <= last)
    producers = {int(p) for c in chunks for p in c.producer_ids[c.is_transactional | c.is_control].tolist()}
    producers.update(t.producer_id for t in consumed)
    ends: dict[int, list[ProducerEnd]] = {p: [] for p in producers}
    for start in START_STATES:
        state = CleanedTransactionMetadata()
        state.add_aborted_transactions(list(consumed))
        seeded = state.seed(producers, start)
        for chunk, chunk_types in zip(chunks, types, strict=True):
            run_transactions(chunk, chunk_types, state)
        for p in producers:
            ends[p].append(_end_of(state, p, seeded.get(p)))
    return SegmentTransactions(
        segment.base_offset, position, first, last, consumed, {p: tuple(e) for p, e in ends.items()}
    )


def _end_of(state: CleanedTransactionMetadata, producer: int, seeded: object | None) -> ProducerEnd:
    committed, entry = state.facts_of(producer)
    if entry is None:
        return ProducerEnd(committed, None, None)
    observed = entry.last_observed_batch_offset
    if entry is seeded:
        return ProducerEnd(committed, KEPT, KEPT if observed == CleanedTransactionMetadata.SEEN else observed)
    return ProducerEnd(committed, entry.txn, observed)


def compose(state: CleanedTransactionMetadata, added: Sequence[AbortedTxn], summary: SegmentTransactions) -> bool:
    """Carry ``state`` over the segment of ``summary``, ``added`` being the aborted
    transactions the sequential replay adds just before it: afterwards ``state`` is what
    replaying the segment's headers would have left. False, and ``state`` untouched, when the
    aborted transactions the summary's replay consumed are not those ``state`` would have it
    consume (``.txnindex`` entries no broker writes: last stable offsets that end Kafka's search
    early where the two searches differ); the caller replays the segment itself then."""
    if summary.first_last_offset is None:
        state.add_aborted_transactions(list(added))
        return True
    assert summary.last_offset is not None
    low, high = summary.first_last_offset, summary.last_offset
    would_take = [t for t in [*state.aborted_to_come(), *added] if low < t.first_offset <= high]
    if sorted(would_take, key=_order) != sorted(summary.consumed, key=_order):
        return False
    state.add_aborted_transactions(list(added))
    state.consume_aborted_up_to(low)
    state.take_aborted_up_to(high)
    for producer, ends in summary.ends.items():
        end = ends[START_STATES.index(state.start_facts(producer))]
        state.set_facts(producer, end.committed, end.aborted, end.observed, kept=KEPT)
    return True


def _order(txn: AbortedTxn) -> tuple[int, int, int, int]:
    return txn.first_offset, txn.producer_id, txn.last_offset, txn.last_stable_offset
