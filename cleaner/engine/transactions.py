"""Transaction state carried through one cleaning round (Kafka's
``CleanedTransactionMetadata``, KAFKA_NOTES §9.7).

The cleaner learns which transactions were aborted only from the ``.txnindex`` files; it
walks the batches in offset order and, for each one, answers "may this be discarded?":

- a transactional data batch of an aborted transaction: yes (its ABORT marker is then
  kept, with its txn-index entry, for as long as some of that data is still seen);
- an ABORT marker whose transaction had no data in this round: yes (it goes through the
  delete-horizon path), otherwise no;
- a COMMIT marker: yes unless a transactional batch of the producer came before it in
  this round;
- any other control record (LEADER_CHANGE, ...): never;
- a control batch already emptied by an earlier clean: yes.

One instance serves a whole round, across segment groups (KAFKA-8351).
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple

import numpy as np

from cleaner.records.batch import BatchHeader
from cleaner.records.columns import RecordColumns, decode_records
from cleaner.records.control import ControlRecordType
from cleaner.records.scan import Batches
from cleaner.storage.index import AbortedTxn, TransactionIndex


class _AbortedTransaction:
    __slots__ = ("last_observed_batch_offset", "txn")

    def __init__(self, txn: AbortedTxn) -> None:
        self.txn = txn
        self.last_observed_batch_offset: int | None = None


class ProducerFacts(NamedTuple):
    """What the state holds of one producer: in a committed transaction; with an ongoing
    aborted transaction; a batch of that one seen."""

    committed: bool
    aborted: bool
    observed: bool


class CleanedTransactionMetadata:
    SEEN = -1
    """``last_observed_batch_offset`` of a seeded transaction seen before (``seed``)."""

    def __init__(self) -> None:
        self._aborted: list[tuple[int, int, AbortedTxn]] = []  # heap by first offset
        self._tiebreak = itertools.count()
        self._ongoing_aborted: dict[int, _AbortedTransaction] = {}
        self._ongoing_committed: set[int] = set()
        self.cleaned_index: TransactionIndex | None = None
        """The txn index of the segment being written; ABORT markers kept this round add
        their entry to it unchanged."""

    def add_aborted_transactions(self, txns: list[AbortedTxn]) -> None:
        for txn in txns:
            heapq.heappush(self._aborted, (txn.first_offset, next(self._tiebreak), txn))

    def consume_aborted_up_to(self, offset: int) -> None:
        while self._aborted and self._aborted[0][0] <= offset:
            txn = heapq.heappop(self._aborted)[2]
            self._ongoing_aborted.setdefault(txn.producer_id, _AbortedTransaction(txn))

    # -- what ``transaction_summary`` composes with ----------------------------------------
    def aborted_to_come(self) -> list[AbortedTxn]:
        return [txn for _, _, txn in self._aborted]

    def take_aborted_up_to(self, offset: int) -> list[AbortedTxn]:
        """Remove the aborted transactions beginning at or below ``offset`` from those still
        to come, without consuming them (a summary already did)."""
        out = []
        while self._aborted and self._aborted[0][0] <= offset:
            out.append(heapq.heappop(self._aborted)[2])
        return out

    def start_facts(self, producer_id: int) -> ProducerFacts:
        entry = self._ongoing_aborted.get(producer_id)
        return ProducerFacts(producer_id in self._ongoing_committed, entry is not None,
                             entry is not None and entry.last_observed_batch_offset is not None)

    def facts_of(self, producer_id: int) -> tuple[bool, _AbortedTransaction | None]:
        return producer_id in self._ongoing_committed, self._ongoing_aborted.get(producer_id)

    def seed(self, producer_ids: set[int], facts: ProducerFacts) -> dict[int, object]:
        """Give every producer of ``producer_ids`` the facts ``facts``, an ongoing aborted
        transaction being a stand-in (seen: at offset ``SEEN``); the stand-ins, by producer."""
        seeded: dict[int, object] = {}
        for pid in producer_ids:
            if facts.committed:
                self._ongoing_committed.add(pid)
            if facts.aborted:
                entry = _AbortedTransaction(AbortedTxn(pid, -1, -1, -1))
                entry.last_observed_batch_offset = self.SEEN if facts.observed else None
                self._ongoing_aborted[pid] = seeded[pid] = entry
        return seeded

    def set_facts(self, producer_id: int, committed: bool, aborted: AbortedTxn | str | None,
                  observed: int | str | None, *, kept: str) -> None:
        """Set one producer's facts: ``aborted`` and ``observed`` equal to ``kept`` keep the
        current ongoing aborted transaction and its last seen batch."""
        if committed:
            self._ongoing_committed.add(producer_id)
        else:
            self._ongoing_committed.discard(producer_id)
        if aborted is None:
            self._ongoing_aborted.pop(producer_id, None)
            return
        entry = self._ongoing_aborted[producer_id] if aborted == kept else _AbortedTransaction(aborted)
        if observed != kept:
            entry.last_observed_batch_offset = observed
        self._ongoing_aborted[producer_id] = entry

    def on_control_batch_read(self, batch: BatchHeader, control_type: ControlRecordType | None) -> bool:
        """Whether the marker may be discarded. ``control_type`` is the type of the batch's
        first record, None for a control batch with no records."""
        self.consume_aborted_up_to(batch.last_offset)
        if batch.records_count == 0 or control_type is None:
            return True  # already emptied by an earlier clean (KAFKA-7467)
        if control_type == ControlRecordType.ABORT:
            aborted = self._ongoing_aborted.pop(batch.producer_id, None)
            if aborted is not None and aborted.last_observed_batch_offset is not None:
                if self.cleaned_index is not None:
                    self.cleaned_index.append(aborted.txn)
                return False
            return True
        if control_type == ControlRecordType.COMMIT:
            if batch.producer_id in self._ongoing_committed:
                self._ongoing_committed.discard(batch.producer_id)
                return False
            return True
        return False

    def on_batch_read(self, batch: BatchHeader) -> bool:
        """Whether a data batch belongs to an aborted transaction."""
        self.consume_aborted_up_to(batch.last_offset)
        if not batch.is_transactional:
            return False
        aborted = self._ongoing_aborted.get(batch.producer_id)
        if aborted is not None:
            aborted.last_observed_batch_offset = batch.last_offset
            return True
        self._ongoing_committed.add(batch.producer_id)
        return False


def control_types(
    chunk: Batches, columns: RecordColumns | None = None, v2_rows: np.ndarray | None = None
) -> dict[int, ControlRecordType]:
    """Type of the first record of every control batch that has records."""
    wanted = np.flatnonzero(chunk.is_control & (chunk.records_counts > 0))
    if wanted.size == 0:
        return {}
    if columns is None or v2_rows is None:
        v2_rows = wanted
        columns = decode_records(chunk.select(wanted))
    starts = columns.batch_record_starts
    out = {}
    for i in wanted.tolist():
        v2_index = int(np.searchsorted(v2_rows, i))
        out[i] = ControlRecordType.parse_key(columns.key(int(starts[v2_index])))
    return out


def run_transactions(
    chunk: Batches, types: dict[int, ControlRecordType], transactions: CleanedTransactionMetadata
) -> np.ndarray:
    """``shouldDiscardBatch`` for every batch, in order. Only transactional and control
    batches can change or depend on the transaction state; for the others the state
    machine only consumes aborted transactions up to their offset, which the next
    relevant batch does anyway, so they are skipped."""
    out = np.zeros(len(chunk), dtype=bool)
    for i in np.flatnonzero(chunk.is_transactional | chunk.is_control).tolist():
        header = chunk.header(i)
        if header.is_control:
            out[i] = transactions.on_control_batch_read(header, types.get(i))
        else:
            out[i] = transactions.on_batch_read(header)
    return out
