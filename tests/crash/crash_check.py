"""The crash-consistency check of an operation on Kafka log directories (docs/testing.md).

``check_log_operation(root, partitions, operation)`` runs ``operation`` (any callable that
changes partition directories under ``root`` through ``cleaner.storage.files``), records
its file operations, and judges every tree a crash could leave (``crash_recorder``) with
Kafka's start-up rules (``kafka_startup``, independent of the project's loader):

- offsets strictly increase through the log: no offset twice, none out of order;
- the log is, record for record, one of the operation's versions: the log before it, after
  it, or after one of its ``Log.replace_segments`` (a clean swaps group after group); a
  crash never leaves part of a swap (atomicity), except what Kafka's own swap recovery
  leaves past the commit point: the whole new set with some of the group's old segments
  past it, which a consumer reads the same as the new log;
- once a crash leaves the new log even with only the durable names and bytes on disk, every
  later crash does too: nothing committed is lost;
- when the operation returns, the new log is durable, and final: no ``.swap`` or
  ``.cleaned`` name is left for start-up (or the next clean) to interpret.

It returns the failures as sentences naming the model, the step after which the crash
came, the variant and what is wrong; an empty list is a pass.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from crash_recorder import CrashState, Model, Recording, crash_states, record
from kafka_startup import Loaded, Rec, next_offset, offset_from_file, start_up

from cleaner.storage.log import Log

MAX_FAILURES = 20
SOAK = os.environ.get("CRASH_SOAK") == "1"
"""``make crash-soak``: the tests add bigger logs."""


def _increasing(loaded: Loaded) -> str | None:
    previous = None
    for first, last in loaded.batch_ranges:
        if previous is not None and first <= previous:
            return f"batch [{first}, {last}] after offset {previous}: an offset twice or out of order"
        previous = last
    return None


def _summary(records: list[Rec]) -> str:
    if not records:
        return "no records"
    return f"{len(records)} records, offsets {records[0].offset}..{records[-1].offset}"


def _latest_values(records: list[Rec]) -> dict[bytes | None, bytes]:
    """What a consumer of the compacted topic ends with: each key's latest value, a
    tombstone taking the key away."""
    latest: dict[bytes | None, bytes] = {}
    for r in records:
        if r.control:
            continue
        if r.value is None:
            latest.pop(r.key, None)
        else:
            latest[r.key] = r.value
    return latest


def _set_end(before: dict[str, bytes], after: dict[str, bytes]) -> int:
    """The next offset after the segments ``after`` holds that ``before`` did not."""
    ends = [
        next_offset(data, offset_from_file(name))
        for name, data in after.items()
        if name.endswith(".log") and before.get(name) != data
    ]
    return max(ends, default=-1)


def _kafkas_partial_swap(records: list[Rec], before: list[Rec], after: list[Rec], set_end: int) -> bool:
    """Whether ``records`` is what Kafka's own swap recovery leaves after a crash past the
    commit point of ``before`` -> ``after`` (whose new segments end at ``set_end``): it
    deletes the old files only in [new base, new next offset), so old segments of the
    group past the new ones may stay, any of them (their deletions reach the disk in any
    order). That is the new log below some offset X at or past ``set_end`` - exactly, so
    never part of a set - then old records from X on; and it reads the same to a consumer
    (each key's latest value) as the new log. The cleaner checkpoint has not moved, so
    the next clean redoes the work. Kafka's own cleaner leaves such states."""
    common = 0
    for mine, new in zip(records, after, strict=False):
        if mine != new:
            break
        common += 1
    if common == len(records):
        return False  # a strict prefix of the new log: records lost, not a partial swap
    split = records[common].offset
    if split < set_end or (common < len(after) and after[common].offset < split):
        return False  # part of the new set, or a record of the new log below X, missing
    old = iter(r for r in before if r.offset >= split)
    from_old = all(any(r == o for o in old) for r in records[common:])  # a subsequence
    return from_old and _latest_values(records) == _latest_values(after)


@functools.lru_cache(maxsize=4096)
def _start_up(image: tuple[tuple[str, bytes], ...]) -> Loaded:
    """Many crash states are the same tree: judge each once."""
    return start_up(dict(image))


def written_tree(recording: Recording, k: int, directory: str) -> dict[str, bytes]:
    """The directory as of step ``k`` with everything on disk (no crash)."""
    step = recording.steps[k]
    return {n: step.contents[i] for n, i in step.names.get(directory, {}).items()}


@dataclass
class LogCheck:
    """The verdicts for one partition. Its versions are the logs start-up gives for the
    directory as written before the operation, after each call that completes a unit of
    it (``Log.replace_segments``: a clean swaps group after group) and after it: the
    states the operation means to pass through. Every crash must leave one of them."""

    partition: str
    versions: list[list[Rec]]
    set_ends: list[int]
    """For each version after the first: the next offset of the segments its swap wrote."""

    @classmethod
    def of(cls, recording: Recording, partition: str) -> LogCheck:
        points = [0, *(s.number for s in recording.steps if s.call == "version")]
        versions: list[list[Rec]] = []
        set_ends: list[int] = []
        previous: dict[str, bytes] = {}
        for k in points:
            tree = written_tree(recording, k, partition)
            records = start_up(tree).records
            if not versions or versions[-1] != records:
                versions.append(records)
                set_ends.append(_set_end(previous, tree))
            previous = tree
        return cls(partition, versions, set_ends)

    def outcome(self, state: CrashState, at_least: int) -> tuple[int, str | None]:
        """(index of the version the crash left, or -1, and the problem)."""
        try:
            loaded = _start_up(tuple(sorted(state.tree.get(self.partition, {}).items())))
        except Exception as e:  # a start-up that throws is a broker that does not start
            return -1, f"start-up fails: {type(e).__name__}: {e}"
        problem = _increasing(loaded)
        if problem:
            return -1, problem
        records = loaded.records
        matches = [i for i, v in enumerate(self.versions) if v == records]
        if not matches:
            matches = [
                i
                for i in range(len(self.versions) - 1)
                if _kafkas_partial_swap(records, *self.versions[i : i + 2], self.set_ends[i + 1])
            ]
        if not matches:
            versions = ", ".join(_summary(v) for v in self.versions)
            return -1, (
                f"a log that is none of the operation's versions ({versions}): {_summary(records)}; "
                f"start-up: {'; '.join(loaded.actions) or 'nothing'}"
            )
        if max(matches) < at_least:
            return max(matches), (
                f"version {max(matches)} ({_summary(records)}) is back, though an earlier crash already kept "
                f"version {at_least} durably: something committed was lost"
            )
        return max(matches), None


def _minimal_at_end(recording: Recording, model: Model, partition: str) -> list[str]:
    last = len(recording.steps) - 1
    for state in crash_states(recording, model, [partition], prefixes=[last]):
        if state.minimal:
            return sorted(state.tree.get(partition, {}))
    return []


def judge(recording: Recording, checks: Iterable[LogCheck], models: Iterable[Model]) -> list[str]:
    failures: list[str] = []
    for model in models:
        for check in checks:
            durable = 0
            for state in crash_states(recording, model, [check.partition]):
                version, problem = check.outcome(state, durable)
                where = f"{model.value}, {check.partition}, crash {recording.describe(state.prefix)}, {state.variant}"
                if problem:
                    failures.append(f"{where}: {problem}")
                elif state.minimal:
                    durable = max(durable, version)
                if len(failures) >= MAX_FAILURES:
                    return failures
            final = [n for n in _minimal_at_end(recording, model, check.partition) if n.endswith((".swap", ".cleaned"))]
            if final:
                failures.append(
                    f"{model.value}, {check.partition}: when the operation returns, a crash still leaves {final[:4]}: "
                    "start-up, or the next operation, would have to decide what they mean"
                )
            if durable != len(check.versions) - 1:
                failures.append(
                    f"{model.value}, {check.partition}: the log the operation leaves is not durable when it returns "
                    f"(a crash then leaves version {durable} of {len(check.versions) - 1})"
                )
    return failures


def check_log_operation(
    root: str | os.PathLike[str],
    partitions: Iterable[str],
    operation: Callable[[], object],
    *,
    models: Iterable[Model] = (Model.ORDERED, Model.REORDERED),
    durable: Iterable[str | os.PathLike[str]] = (),
    versions: Iterable[tuple[object, str]] = ((Log, "replace_segments"),),
) -> tuple[list[str], Recording]:
    """Run ``operation`` on the log dir ``root`` and judge every crash state of the
    partition directories ``partitions`` (names relative to ``root``). ``durable``: trees
    outside ``root`` already on disk that the operation may link in (staged files);
    ``versions``: the methods whose return is a version the log may be left in."""
    root = Path(root)
    partitions = list(partitions)
    recording = record(root, operation, durable, versions)
    checks = [LogCheck.of(recording, p) for p in partitions]
    return judge(recording, checks, list(models)), recording
