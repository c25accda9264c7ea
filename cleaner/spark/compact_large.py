"""``kafka-cleaner spark compact-large``: one huge partition, cleaned round after round -
each round in two distributed phases (``cleaner.spark.phases``), committed by the driver -
until it is no longer eligible, as ``kafka-cleaner clean`` runs rounds. A round:

1. The driver plans the round with the engine (``cleaner.spark.plan``): first dirty and
   first uncleanable offsets, active producers, the legacy delete horizon, the transaction
   state at each dirty segment and each group, Kafka's segment groups.
2. Phase 1 builds the offset map across executors; the driver finds where the
   single-node map would have filled up, so the round ends at the same offset.
3. Phase 2 rewrites the groups in parallel into staged ``.cleaned`` segments.
4. After the job succeeded, the driver writes the manifest, then commits from it: in place,
   the staged segments are swapped in with Kafka's protocol; under ``--output``, the
   partition as that swap would leave it is assembled from the kept segments and the staged
   ones (``staged.assemble``) and published with a rename. The ``cleaner-offset-checkpoint``
   gets the round's end offset, as ``doneCleaning`` writes it.

The rounds after the first run in place on the partition the first committed: the input's
(holding its log dir's ``.lock``) or, under ``--output``, the output's. Each round is its own
run (``cleaner.spark.staging``) with its own plan; a round stops early where the
single-node offset map fills up, and the next one starts there. The result is
byte-identical to ``kafka-cleaner clean`` on the same partition and clock.
"""

from __future__ import annotations

import logging
import shutil
import time as _time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cleaner.clock import SYSTEM_TIME, FixedTime, Time
from cleaner.config import Policy
from cleaner.engine.transaction_summary import Summaries
from cleaner.errors import CorruptDataError, KafkaCleanerError
from cleaner.storage import files
from cleaner.storage.lock import LogDirLock
from cleaner.storage.log import Log
from cleaner.storage.segment import LOG_SUFFIX
from cleaner.storage.staged import assemble, staged_segments, swap_in

from .commit import (
    commit_identity,
    holds_commit,
    open_for_commit,
    swap_applied,
    update_cleaner_checkpoint,
    write_output_root,
)
from .object_store import ObjectInfo, ObjectLogDir, download, in_hole, mirror
from .phases import KeyScope, RoundsOutcome, balance, group_done_dir, run_rounds, transaction_summaries
from .plan import (
    PartitionRef,
    RoundPlan,
    SegmentRef,
    StalePlanError,
    local_path,
    log_config_for,
    open_managed,
    partition_fingerprint,
    partition_of_dir,
    partition_of_input,
    plan_round,
    policy_identity,
    root_fingerprint,
    run_id,
)
from .staging import COMMITTED, MANIFEST, STAGING_DIR_NAME, RunDir, copy_tree, maybe_fail, publish_dir

log = logging.getLogger("cleaner.spark.compact_large")


@dataclass
class CompactLargeResult:
    """One round: one run, one plan, one commit."""

    run_id: str
    status: str
    """committed, already-committed, not-eligible or nothing-to-clean"""
    partition: str
    first_dirty_offset: int | None = None
    end_offset: int | None = None
    map_keys: int | None = None
    groups: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    outcome: RoundsOutcome | None = None

    def as_dict(self) -> dict[str, Any]:
        source = sum(g.get("sourceBytes", 0) for g in self.groups)
        cleaned = sum(g.get("cleanedBytes", 0) for g in self.groups)
        return {
            "runId": self.run_id,
            "status": self.status,
            "partition": self.partition,
            "firstDirtyOffset": self.first_dirty_offset,
            "endOffset": self.end_offset,
            "offsetMapKeys": self.map_keys,
            "groups": len(self.groups),
            "bytesBefore": source,
            "bytesAfter": cleaned,
            "recordsRead": sum(g.get("recordsRead", 0) for g in self.groups),
            "recordsWritten": sum(g.get("recordsWritten", 0) for g in self.groups),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }


@dataclass
class CompactLargeOutcome:
    """The rounds of one invocation, in order. ``status`` and ``run_id`` are the first
    round's (``committed`` if any round was), ``end_offset`` the last committed round's: where
    the partition is clean up to now."""

    rounds: list[CompactLargeResult]
    size_before: int
    """the partition's ``.log`` bytes before the first round"""
    size_after: int
    """and after the last: of the output's partition under ``--output``"""

    @property
    def first(self) -> CompactLargeResult:
        return self.rounds[0]

    @property
    def committed(self) -> list[CompactLargeResult]:
        return [r for r in self.rounds if r.status == "committed"]

    @property
    def status(self) -> str:
        return "committed" if self.committed else self.first.status

    @property
    def run_id(self) -> str:
        return self.first.run_id

    @property
    def groups(self) -> list[dict[str, Any]]:
        """The first round's groups."""
        return self.first.groups

    @property
    def first_dirty_offset(self) -> int | None:
        return self.first.first_dirty_offset

    @property
    def end_offset(self) -> int | None:
        return self.committed[-1].end_offset if self.committed else self.first.end_offset

    def as_dict(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "status": self.status,
            "partition": self.first.partition,
            "firstDirtyOffset": self.first_dirty_offset,
            "endOffset": self.end_offset,
            "sizeBefore": self.size_before,
            "sizeAfter": self.size_after,
            "rounds": [r.as_dict() for r in self.rounds],
        }


def default_staging(output: Path | None, log_dir: Path) -> Path:
    """Beside the data, never inside a log dir (a broker refuses a directory it does not
    know there): under ``--output``, or next to the input log dir."""
    return (output / STAGING_DIR_NAME) if output is not None else (log_dir.parent / STAGING_DIR_NAME)


def compact_large(
    spark: Any,
    partition: str | Path,
    policy: Policy,
    *,
    output: str | Path | None = None,
    now_ms: int | None = None,
    staging: str | Path | None = None,
    faults: Mapping[str, Any] | None = None,
    time: Time = SYSTEM_TIME,
    max_rounds: int | None = None,
) -> CompactLargeOutcome:
    """Rounds of ``partition`` (a partition directory, or ``s3://bucket/prefix/<topic>-<n>``
    with ``output``) while it is eligible (at most ``max_rounds``), the first committed in
    place - holding its log dir's ``.lock`` - or into the log dir ``output``, the others in
    place where the first committed. Idempotent: the same plan commits once (see
    ``cleaner.spark.staging``); a rerun after a crash finishes the round it was in and goes on.

    From object storage the driver plans on a hollow mirror (``object_store``: each
    segment's head and tail), the tasks read their partition's mirror on their host, and the
    output's kept segments are downloaded by the executors into it."""
    if max_rounds is not None and max_rounds < 1:
        raise KafkaCleanerError(f"max_rounds must be at least 1, not {max_rounds}")
    ref = partition_of_input(partition)
    out = local_path(output, "--output") if output is not None else None
    if ref.in_object_storage:
        if out is None:
            raise KafkaCleanerError(f"{_where(ref)}: object storage is never cleaned in place (no rename, no "
                                    f"lock): give --output, a log dir on a file system")
    elif out is not None and (out == Path(ref.root) or Path(ref.root) in out.parents or ref.path in out.parents):
        raise KafkaCleanerError(f"--output {out} must not be the input log dir or inside it")
    staging_root = Path(staging).absolute() if staging is not None else default_staging(out, Path(ref.root))
    size_before = _log_bytes(ref)
    first = _round(spark, ref, policy, out, now_ms, staging_root, faults, time)
    rounds = [first]
    # The next rounds work in place where the first committed: the output's copy under --output.
    # A first round committed by an earlier invocation (already-committed: it was killed in a
    # later round) goes on too; where nothing is left, the next round is not eligible.
    here = partition_of_dir(out / ref.tp.dir_name) if out is not None else ref
    going_on = ("committed", "already-committed")
    while rounds[-1].status in going_on and (max_rounds is None or len(rounds) < max_rounds):
        following = _round(spark, here, policy, None, now_ms, staging_root, faults, time)
        if following.status != "committed":
            break
        previous_end = rounds[-1].end_offset
        if previous_end is not None and (following.end_offset or 0) <= previous_end:
            raise KafkaCleanerError(f"{here.path}: a round ended at {following.end_offset}, not past the previous "
                                    f"round's end {previous_end}: no progress")
        rounds.append(following)
        log.info("%s: round %d cleaned [%s, %s)", here.path, len(rounds), following.first_dirty_offset,
                 following.end_offset)
    if out is not None and len(rounds) > 1:
        # The first round's run committed the output it published; the later rounds changed
        # that output in place. Its record now names what they left, so that a rerun finds the
        # output clean (already-committed), not restored (planned and published again).
        RunDir(staging_root, first.run_id).mark_committed(
            {"endOffset": rounds[-1].end_offset, "identity": commit_identity([out], [here.path])})
    size_after = _log_bytes(here) if here.path.is_dir() else size_before
    return CompactLargeOutcome(rounds, size_before, size_after)


def _log_bytes(ref: PartitionRef) -> int:
    if ref.in_object_storage:
        objects = ObjectLogDir.parse(ref.root).listing(ref.tp.dir_name + "/")
        return sum(o.size for o in objects if o.name.endswith(LOG_SUFFIX))
    return sum(p.stat().st_size for p in ref.path.glob("*" + LOG_SUFFIX))


def _where(ref: PartitionRef) -> str:
    """The partition as its user named it (``Path`` would fold ``s3://`` to ``s3:/``)."""
    return f"{ref.root}/{ref.tp.dir_name}" if ref.in_object_storage else str(ref.path)


def _round(
    spark: Any,
    ref: PartitionRef,
    policy: Policy,
    out: Path | None,
    now_ms: int | None,
    staging_root: Path,
    faults: Mapping[str, Any] | None,
    time: Time,
) -> CompactLargeResult:
    """One round of ``ref`` (if it is eligible), in place or into the log dir ``out``."""
    started = _time.perf_counter()
    lock = None
    if out is None:
        lock = LogDirLock(ref.root).acquire()  # LogDirLockedError if a broker holds it
    try:
        if out is None:
            resumed = _resume_in_place(staging_root, ref, policy)
            if resumed is not None:
                return resumed
        return _run(spark, ref, policy, out, now_ms, staging_root, faults, time, started)
    finally:
        if lock is not None:
            lock.release()


def _run(
    spark: Any,
    ref: PartitionRef,
    policy: Policy,
    out: Path | None,
    now_ms: int | None,
    staging_root: Path,
    faults: Mapping[str, Any] | None,
    time: Time,
    started: float,
) -> CompactLargeResult:
    t_plan = _time.perf_counter()
    manager, managed = open_managed(ref, policy, time, read_only=out is not None, hollow=ref.in_object_storage)
    identity = {
        "partition": [ref.root, ref.topic, ref.partition],
        "output": str(out) if out is not None else None,
        "files": partition_fingerprint(ref),
        "root": root_fingerprint(ref.root),
        "policy": policy_identity(policy),
        "nowMs": now_ms,
    }
    run = RunDir(staging_root, run_id("compact-large", identity))
    result = CompactLargeResult(run.id, "committed", _where(ref))
    if run.committed and not holds_commit((run.read_json(COMMITTED) or {}).get("identity")):
        log.warning("%s: run %s no longer holds what it committed (restored?): planning it again", _where(ref), run.id)
        shutil.rmtree(run.path)
    if run.committed:
        result.status = "already-committed"
        done = run.read_json(MANIFEST) or {}
        result.first_dirty_offset = done.get("firstDirtyOffset")
        result.end_offset = done.get("endOffset")
        result.groups = done.get("groups", [])
        return result
    manifest = run.read_json(MANIFEST)
    if manifest is None:
        saved = run.read_json("plan.json")
        now = saved["now"] if saved else (now_ms if now_ms is not None else time.milliseconds())
        clock = FixedTime(now)
        manager.time = clock
        # As kafka-cleaner clean: only an eligible partition is cleaned (KAFKA_NOTES §6.1).
        eligible = _eligible(manager, managed, ref, now)
        if not eligible:
            result.status = "not-eligible"
            if out is None and not saved:  # nothing to do in place, and no run to leave behind
                return result
        run.create()
        run.write_json("plan.json", {"now": now, "identity": identity})
        plan = None
        if eligible:
            the_log = managed.log
            listed = [SegmentRef(s.base_offset, s.size, s.last_modified_ms) for s in the_log.segments]

            def summaries_from(wanted: list[tuple[int, int]]) -> Summaries:
                return transaction_summaries(spark, ref, managed.rule, the_log.log_start_offset, listed, wanted,
                                             policy.cleaner.max_io_bytes_per_second)

            with _hollow_reads(ref):
                plan = plan_round(0, ref, manager, managed, policy, now, clock, summaries_from=summaries_from)
        result.seconds["plan"] = _time.perf_counter() - t_plan
        manifest = _execute(spark, run, ref, managed, plan, out, faults, result)
    else:
        log.info("%s: the job of run %s succeeded earlier; committing it", _where(ref), run.id)
    result.first_dirty_offset = manifest.get("firstDirtyOffset")
    result.end_offset = manifest.get("endOffset")
    result.groups = manifest["groups"]
    if manifest["endOffset"] is None and result.status == "committed":
        result.status = "nothing-to-clean"
    maybe_fail(faults, "before-commit")
    t_commit = _time.perf_counter()
    commit(run, manifest, policy, spark)
    result.seconds["commit"] = _time.perf_counter() - t_commit
    result.seconds["total"] = _time.perf_counter() - started
    return result


def _eligible(manager: Any, managed: Any, ref: PartitionRef, now: int) -> bool:
    """The manager's verdict. A partition it cannot look at is an error here, not "not
    eligible": compact-large has no other partition to go on with, and a person must hear why."""
    row = manager.report(now)[0]
    if row.reason != "uncleanable":
        return bool(row.eligible)
    with _hollow_reads(ref):  # the failure again, raised: a read past a hollow mirror says so
        manager.log_to_clean(managed, manager.all_cleaner_checkpoints().get(ref.tp), now)
        manager.last_stable_offset(managed, now)
    raise KafkaCleanerError(f"{_where(ref)}: uncleanable: {row.uncleanable_reason}")


@contextmanager
def _hollow_reads(ref: PartitionRef) -> Iterator[None]:
    """A read of the driver's hollow mirror past what it downloaded, named as that (a hole
    reads as zeros, which the readers refuse as a corrupt entry), not as a corrupt segment."""
    try:
        yield
    except CorruptDataError as e:
        if not (ref.in_object_storage and e.path is not None and e.position is not None
                and in_hole(e.path, e.position)):
            raise
        raise KafkaCleanerError(
            f"{_where(ref)}: planning read {Path(e.path).name} at position {e.position}, which the driver does "
            f"not download (it reads each segment's head and tail only; see docs/spark.md): {e}") from e


def _execute(
    spark: Any,
    run: RunDir,
    ref: PartitionRef,
    managed: Any,
    plan: RoundPlan | None,
    out: Path | None,
    faults: Mapping[str, Any] | None,
    result: CompactLargeResult,
) -> dict[str, Any]:
    """The distributed round, then the manifest."""
    groups: list[dict[str, Any]] = []
    if plan is not None:
        scope = KeyScope(0, ref, plan.rule, plan.log_start_offset, plan.segments, False, plan)
        outcome = run_rounds(spark, [scope], run=run, faults=faults)
        result.outcome = outcome
        result.map_keys = outcome.map_keys.get(0)
        result.seconds.update(outcome.seconds)
        produced = outcome.groups.get(0, [])
        if len(produced) != len(plan.groups):
            raise KafkaCleanerError(f"{_where(ref)}: {len(produced)} of {len(plan.groups)} groups were rewritten")
        for g, r in enumerate(produced):
            if not (group_done_dir(run, plan, g) / "result.json").exists():
                raise KafkaCleanerError(f"{_where(ref)}: group {g} is not staged")
            groups.append({**r, "staged": str(group_done_dir(run, plan, g).relative_to(run.path))})
    maybe_fail(faults, "before-manifest")
    manifest = {
        "kind": "compact-large",
        "partition": {"root": ref.root, "topic": ref.topic, "partition": ref.partition},
        "output": str(out) if out is not None else None,
        "logStartOffset": managed.log.log_start_offset,
        "firstDirtyOffset": plan.first_dirty_offset if plan is not None else None,
        "endOffset": plan.end_offset if plan is not None else None,
        "mapStopOffset": plan.map_stop_offset if plan is not None else None,
        "segments": [[s.base, s.size, s.mtime_ms] for s in plan.segments] if plan is not None else [],
        "groups": groups,
    }
    run.write_json(MANIFEST, manifest)
    return manifest


def commit(run: RunDir, manifest: Mapping[str, Any], policy: Policy, spark: Any = None) -> None:
    """Apply a manifest; safe to repeat after a crash at any point. With ``spark``, the
    unchanged segments an ``--output`` partition keeps are copied by its executors, in
    parallel (``copy_on_executors``); the driver links the staged ones and renames."""
    p = manifest["partition"]
    ref = PartitionRef(p["root"], p["topic"], p["partition"])
    rule = policy.rule_for(ref.topic)
    if rule is None:
        raise KafkaCleanerError(f"no policy rule matches topic {ref.topic!r}")
    staged = [seg for g in manifest["groups"] for seg in staged_segments(run.path / g["staged"])]
    replaced = {b for g in manifest["groups"] for b in g["sourceSegments"]}
    updates = {ref.tp: manifest["endOffset"]} if manifest["endOffset"] is not None else {}
    if manifest["output"] is None:
        if staged and not (run.path / "SWAPPED").exists():
            the_log = open_for_commit(ref.path, rule, manifest["logStartOffset"])
            if not swap_applied(ref.path, staged, replaced):
                _check_unchanged(the_log, manifest)
                swap_in(the_log, staged, replaced)
            run.write_json("SWAPPED", {})
        update_cleaner_checkpoint(ref.root, updates)
    else:
        out = Path(manifest["output"])
        work = run.path / "publish" / ref.tp.dir_name
        if not (run.path / "PUBLISHED").exists():
            if not ((run.path / "BUILT").exists() and not work.exists()):
                shutil.rmtree(work, ignore_errors=True)
                source_dir = ref.localized(hollow=True).path
                source = Log.open(source_dir, log_config_for(rule), log_start_offset=manifest["logStartOffset"],
                                  read_only=True)
                try:
                    _check_unchanged(source, manifest)
                    interrupted = bool(source.pending_startup)
                finally:
                    source.close()
                if interrupted:  # a swap left half done in the input: a broker's start-up finishes it first
                    copy_tree(ref.localized().path, work)
                    if staged:
                        the_log = open_for_commit(work, rule, manifest["logStartOffset"])
                        swap_in(the_log, staged, replaced)
                else:  # the unchanged segments only: the replaced ones are never copied
                    assemble(source_dir, work, staged, replaced, copy_all=_copier(spark, ref))
                run.write_json("BUILT", {})
                publish_dir(work, out / ref.tp.dir_name, run.path / "trash")
            run.write_json("PUBLISHED", {})
        root_files = mirror(ObjectLogDir.parse(ref.root)) if ref.in_object_storage else ref.root
        write_output_root(out, root_files, updates)
    root, final = (ref.root, ref.path) if manifest["output"] is None else (out, out / ref.tp.dir_name)
    run.mark_committed({"endOffset": manifest["endOffset"], "identity": commit_identity([root], [final])})
    run.clean_up()


def _copier(spark: Any, ref: PartitionRef) -> Callable[[list[tuple[Path, Path]]], None] | None:
    """How ``assemble`` copies the kept files: by the executors when there are any; from
    object storage, the ``.log`` files (hollow in the driver's mirror) downloaded whole."""
    if not ref.in_object_storage:
        return (lambda pairs: copy_on_executors(spark, pairs)) if spark is not None else None
    log_dir = ObjectLogDir.parse(ref.root)

    def copy_all(pairs: list[tuple[Path, Path]]) -> None:
        objects = {o.name.rpartition("/")[2]: o for o in log_dir.listing(ref.tp.dir_name + "/")}
        gone = [src.name for src, _ in pairs if src.name.endswith(LOG_SUFFIX) and src.name not in objects]
        if gone:
            raise StalePlanError(f"{_where(ref)}: {', '.join(gone[:3])} disappeared since the plan")
        logs = [(objects[src.name], dst) for src, dst in pairs if src.name.endswith(LOG_SUFFIX)]
        for src, dst in pairs:
            if not src.name.endswith(LOG_SUFFIX):
                files.copy_file(src, dst)
        download_on_executors(spark, log_dir, logs)

    return copy_all


def download_on_executors(spark: Any, log_dir: ObjectLogDir, todo: list[tuple[ObjectInfo, Path]]) -> None:
    """Each object downloaded to its path (fsynced), by the executors as ``copy_on_executors``
    copies, or here without ``spark``."""
    def fetch(part: list[tuple[ObjectInfo, str]]) -> None:
        for o, dst in part:
            download(log_dir, o, Path(dst))
            files.fsync_file(Path(dst))

    if spark is None:
        fetch([(o, str(dst)) for o, dst in todo])
    elif todo:
        sc = spark.sparkContext
        slices = balance([((o, str(dst)), o.size) for o, dst in todo], sc.defaultParallelism * 2)
        sc.parallelize(slices, len(slices)).foreach(fetch)


def copy_on_executors(spark: Any, pairs: list[tuple[Path, Path]]) -> None:
    """``files.copy_file`` of each (source, target) pair in a Spark job, balanced by bytes over
    about two tasks per core: the output's unchanged segments are the partition's bulk, and
    the driver would otherwise read and write all of them (docs/spark.md)."""
    if not pairs:
        return
    sc = spark.sparkContext
    weighted = [((str(src), str(dst)), src.stat().st_size) for src, dst in pairs]
    slices = balance(weighted, sc.defaultParallelism * 2)
    sc.parallelize(slices, len(slices)).foreach(
        lambda todo: [files.copy_file(Path(src), Path(dst)) for src, dst in todo])  # fmt: skip


def _check_unchanged(the_log: Any, manifest: Mapping[str, Any]) -> None:
    planned = {b: (size, mtime) for b, size, mtime in manifest["segments"]}
    replaced = {b for g in manifest["groups"] for b in g["sourceSegments"]}
    for s in the_log.segments:
        if s.base_offset in replaced and planned.get(s.base_offset) != (s.size, s.last_modified_ms):
            raise StalePlanError(f"{the_log.dir}: segment {s.base_offset} changed since the plan")


def _resume_in_place(staging_root: Path, ref: PartitionRef, policy: Policy) -> CompactLargeResult | None:
    """Finish the commit of an earlier in-place run of this partition that was killed after
    its job succeeded (its manifest exists, it is not committed): planning now would see a
    half-committed partition. Returns that run's result."""
    if not staging_root.is_dir():
        return None
    resumed = None
    for d in sorted(staging_root.iterdir()):
        run = RunDir(staging_root, d.name)
        manifest = run.read_json(MANIFEST) if d.name.startswith("compact-large-") else None
        if manifest is None or run.committed or manifest.get("output") is not None:
            continue
        p = manifest["partition"]
        if (p["root"], p["topic"], p["partition"]) != (ref.root, ref.topic, ref.partition):
            continue
        try:
            log.warning("%s: completing the commit of interrupted run %s", ref.path, run.id)
            commit(run, manifest, policy)
        except StalePlanError as e:
            log.warning("%s: abandoning run %s: %s", ref.path, run.id, e)
            run.mark_committed({"abandoned": str(e)})
            run.clean_up()
            continue
        resumed = CompactLargeResult(
            run.id,
            "committed" if manifest["endOffset"] is not None else "nothing-to-clean",
            str(ref.path),
            first_dirty_offset=manifest["firstDirtyOffset"],
            end_offset=manifest["endOffset"],
            groups=manifest["groups"],
        )
    return resumed


__all__ = ["CompactLargeOutcome", "CompactLargeResult", "commit", "compact_large"]
