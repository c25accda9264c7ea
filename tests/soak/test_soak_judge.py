"""The soak's judge of stale staged sets (``soak_kafka.unexplained_stale_sets``), on the case a
soak met on 3.9.2: soak-txn-0 moved from kafka-logs-b to kafka-logs-a between two DeleteRecords,
each of which made one staged set stale, one in each log dir."""

from __future__ import annotations

from soak_kafka import LOG_START_MOVED, LogStartMoves, _log_time, unexplained_stale_sets

PART = "soak-txn-0"


def _stale(stamp: str, where: str) -> tuple[tuple[str, str, str], list[tuple[str, str]]]:
    return (LOG_START_MOVED, PART, where), [(stamp, f"WARNING cleaner.sidecar: {where} {PART}: deleted the staged set")]


def _moves(*stamps: str) -> LogStartMoves:
    moves = LogStartMoves()
    for stamp in stamps:
        moves.record(PART, _log_time(stamp))
    return moves


IN_TWO_DIRS = dict(
    [_stale("2026-11-29 02:20:12,872", "kafka-logs-b"), _stale("2026-11-29 02:20:34,761", "kafka-logs-a")]
)


def test_two_moves_explain_two_stale_sets_in_two_log_dirs() -> None:
    moves = _moves("2026-11-29 02:20:12,400", "2026-11-29 02:20:33,300")
    assert unexplained_stale_sets(IN_TWO_DIRS, moves) == {}


def test_one_move_explains_one_stale_set_only() -> None:
    assert unexplained_stale_sets(IN_TWO_DIRS, _moves("2026-11-29 02:20:12,400")) == {(PART, "kafka-logs-a"): 1}


def test_a_move_asked_for_after_the_set_was_found_stale_explains_nothing() -> None:
    groups = dict([_stale("2026-11-29 02:20:12,872", "kafka-logs-b")])
    assert unexplained_stale_sets(groups, _moves("2026-11-29 02:20:14,000")) == {(PART, "kafka-logs-b"): 1}


def test_a_move_explains_a_set_a_later_sidecar_finds_once() -> None:
    moves = _moves("2026-11-29 02:20:12,400")
    assert unexplained_stale_sets(dict([_stale("2026-11-29 02:20:20,000", "kafka-logs-a")]), moves) == {}
    assert unexplained_stale_sets(dict([_stale("2026-11-29 02:20:30,000", "kafka-logs-a")]), moves) == {
        (PART, "kafka-logs-a"): 1
    }
