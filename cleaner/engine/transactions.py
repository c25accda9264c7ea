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

from cleaner.records.batch import BatchHeader
from cleaner.records.control import ControlRecordType
from cleaner.storage.index import AbortedTxn, TransactionIndex


class _AbortedTransaction:
    __slots__ = ("last_observed_batch_offset", "txn")

    def __init__(self, txn: AbortedTxn) -> None:
        self.txn = txn
        self.last_observed_batch_offset: int | None = None


class CleanedTransactionMetadata:
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

    def _consume_aborted_up_to(self, offset: int) -> None:
        while self._aborted and self._aborted[0][0] <= offset:
            txn = heapq.heappop(self._aborted)[2]
            self._ongoing_aborted.setdefault(txn.producer_id, _AbortedTransaction(txn))

    def on_control_batch_read(self, batch: BatchHeader, control_type: ControlRecordType | None) -> bool:
        """Whether the marker may be discarded. ``control_type`` is the type of the batch's
        first record, None for a control batch with no records."""
        self._consume_aborted_up_to(batch.last_offset)
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
        self._consume_aborted_up_to(batch.last_offset)
        if not batch.is_transactional:
            return False
        aborted = self._ongoing_aborted.get(batch.producer_id)
        if aborted is not None:
            aborted.last_observed_batch_offset = batch.last_offset
            return True
        self._ongoing_committed.add(batch.producer_id)
        return False
