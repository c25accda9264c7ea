"""``kafka-cleaner spark compact``: many partitions, one Spark task each, each running the
engine unchanged.

A task copies its partition (with the log dir's root files: checkpoints, clean-shutdown
marker) into a private log dir in its attempt directory and runs ``cleaning.clean`` there:
the same cleaner threads, manager, rounds, retention and checkpoint rules as ``kafka-cleaner
clean``, with the job's fixed clock. It then records which segments the engine replaced
(by file identity) and renames the attempt into the run's ``done/`` area.

The driver commits from the manifest:

- ``--output``: each staged partition directory is renamed to ``<output>/<log dir
  name>/<partition>`` and each output log dir gets the source's root files with its
  ``cleaner-offset-checkpoint`` updated. The source is only read.
- ``--output s3://bucket/prefix``: the tasks upload the partitions, the driver the root
  files and then ``_SUCCESS`` (``cleaner.spark.object_output``).
- in place (a shared volume every executor sees; the driver holds each log dir's
  ``.lock`` for the whole job, so a running broker makes the job refuse): each changed
  partition's new segments are swapped in with Kafka's protocol in one
  ``replace_segments``, then each log dir's ``cleaner-offset-checkpoint`` is updated.

Partitions that are not eligible (and have no retention to apply) are not copied in place,
and copied as they are under ``--output``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time as _time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cleaner import cleaning
from cleaner.clock import SYSTEM_TIME, FixedTime, Time
from cleaner.config import Policy
from cleaner.errors import KafkaCleanerError
from cleaner.storage import files
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.loader import apply_startup_plan, offset_of, startup_plan_for
from cleaner.storage.lock import LOCK_FILE, LogDirLock
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.segment import LOG_SUFFIX, SEGMENT_FILE_SUFFIXES, file_name
from cleaner.storage.staged import staged_segments, swap_in

from .commit import (
    commit_identity,
    holds_commit,
    open_for_commit,
    swap_applied,
    update_cleaner_checkpoint,
    write_output_root,
)
from .object_output import (
    fetch_root_file,
    holds_output,
    output_identity,
    output_log_dir,
    upload_files,
    withdraw_success,
    write_success,
)
from .object_store import ObjectLogDir, is_object_uri, mirror, scratch_base
from .plan import (
    PartitionRef,
    StalePlanError,
    dir_fingerprint,
    input_root,
    list_partitions,
    local_path,
    open_managed,
    partition_fingerprint,
    policy_identity,
    root_fingerprint,
    run_id,
)
from .session import task_io_rate
from .staging import (
    COMMITTED,
    MANIFEST,
    STAGING_DIR_NAME,
    RunDir,
    copy_tree,
    finish_attempt,
    maybe_fail,
    new_attempt_dir,
    publish_dir,
)

log = logging.getLogger("cleaner.spark.compact")

STATS_COLUMNS = (
    ("sourceRoot", "string"),
    ("topic", "string"),
    ("partition", "int"),
    ("action", "string"),
    ("eligible", "boolean"),
    ("reason", "string"),
    ("rounds", "int"),
    ("firstDirtyOffset", "long"),
    ("endOffset", "long"),
    ("bytesBefore", "long"),
    ("bytesAfter", "long"),
    ("recordsRead", "long"),
    ("recordsWritten", "long"),
    ("tombstonesRemoved", "long"),
    ("seconds", "double"),
    ("reused", "boolean"),
    ("uncleanable", "string"),
)


@dataclass(frozen=True)
class CompactTask:
    ref: PartitionRef
    root_key: str
    source_root: str
    """The INPUT as given (the report's and the stats' ``sourceRoot``)."""


@dataclass
class CompactResult:
    run_id: str
    status: str
    """committed or already-committed"""
    partitions: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def uncleanable(self) -> list[dict[str, Any]]:
        return [p for p in self.partitions if p.get("uncleanable")]

    def rows(self) -> list[dict[str, Any]]:
        return [{name: p.get(name) for name, _ in STATS_COLUMNS} for p in self.partitions]

    def dataframe(self, spark: Any) -> Any:
        schema = ", ".join(f"{name} {kind}" for name, kind in STATS_COLUMNS)
        return spark.createDataFrame([tuple(r.values()) for r in self.rows()], schema)


def root_keys(roots: Sequence[str]) -> dict[str, str]:
    """The directory name of each log dir under ``--output``: its own name, with a short
    hash of its path when two inputs share a name (``/b1/data``, ``/b2/data``)."""
    names = [Path(r).name or "root" for r in roots]
    return {
        r: (n if names.count(n) == 1 else f"{n}-{hashlib.sha256(r.encode()).hexdigest()[:8]}")
        for r, n in zip(roots, names, strict=True)
    }


def compact(
    spark: Any,
    inputs: Sequence[str | Path],
    policy: Policy,
    *,
    output: str | Path | None = None,
    now_ms: int | None = None,
    staging: str | Path | None = None,
    faults: Mapping[str, Any] | None = None,
    time: Time = SYSTEM_TIME,
) -> CompactResult:
    """Every eligible partition of the log dirs ``inputs`` cleaned by the engine, one Spark
    task each, committed in place (holding each log dir's ``.lock``) or under ``output``.
    Idempotent: the same plan commits once (see ``cleaner.spark.staging``)."""
    started = _time.perf_counter()
    given = {input_root(p): str(p) for p in inputs}
    roots = sorted(given)
    for root in roots:
        if not is_object_uri(root) and not Path(root).is_dir():
            raise KafkaCleanerError(f"{root}: no such log directory")
    object_out = ObjectLogDir.parse(str(output)) if output is not None and is_object_uri(str(output)) else None
    out = local_path(output, "--output") if output is not None and object_out is None else None
    if output is None and any(is_object_uri(root) for root in roots):
        raise KafkaCleanerError("a log dir in object storage is cleaned copy-on-write: give --output")
    for root in roots:
        if out is not None and not is_object_uri(root):
            r = Path(root)
            if out == r or r in out.parents or out in r.parents:
                raise KafkaCleanerError(f"--output {out} must be outside the input log dir {root}")
        if object_out is not None and is_object_uri(root) and object_out.overlaps(ObjectLogDir.parse(root)):
            raise KafkaCleanerError(f"--output {object_out.uri} must be outside the input log dir {root}")
    if object_out is not None and staging is None:
        raise KafkaCleanerError(
            f"--output {object_out.uri}: an output in object storage needs --staging, a directory the driver "
            "and every executor see (the run's plan, manifest and task results; no segment data)"
        )
    staging_root = (
        Path(staging).absolute()
        if staging is not None
        else (out / STAGING_DIR_NAME if out is not None else Path(roots[0]).parent / STAGING_DIR_NAME)
    )
    output_name = object_out.uri if object_out is not None else str(out) if out is not None else None
    locks: list[LogDirLock] = []
    try:
        if output is None:
            for root in roots:
                locks.append(LogDirLock(root).acquire())  # LogDirLockedError if a broker holds it
            resumed = _resume_in_place(staging_root, roots, policy)
            if resumed is not None:
                return resumed
        refs = list_partitions(roots, policy, compacted_only=True)
        if output is None:
            for ref in refs:  # what opening the log writable does first, as a broker's start-up
                startup = startup_plan_for(ref.path)
                if not startup.is_empty:
                    apply_startup_plan(ref.path, startup)
        keys = root_keys(roots)
        identity = {
            "output": output_name,
            "roots": {root: root_fingerprint(root) for root in roots},
            "partitions": [[ref.root, ref.topic, ref.partition, partition_fingerprint(ref)] for ref in refs],
            "policy": policy_identity(policy),
            "nowMs": now_ms,
        }
        run = RunDir(staging_root, run_id("compact", identity))
        result = CompactResult(run.id, "committed")
        if run.committed and not _holds(run, object_out):
            log.warning("run %s: its paths no longer hold what it committed (restored?): planning it again", run.id)
            shutil.rmtree(run.path)
        if run.committed:
            result.status = "already-committed"
            result.partitions = (run.read_json(MANIFEST) or {}).get("partitions", [])
            for p in result.partitions:
                p["reused"] = True
            return result
        manifest = run.read_json(MANIFEST)
        if manifest is None:
            saved = run.read_json("plan.json")
            now = saved["now"] if saved else (now_ms if now_ms is not None else time.milliseconds())
            run.create()
            run.write_json("plan.json", {"now": now, "identity": identity})
            tasks = [CompactTask(ref, keys[ref.root], given[ref.root]) for ref in refs]
            if object_out is not None:
                withdraw_success(object_out)  # not whole from here until the commit
            t0 = _time.perf_counter()
            partitions = _run_tasks(spark, tasks, policy, now, run, output_name, faults)
            result.seconds["job"] = _time.perf_counter() - t0
            maybe_fail(faults, "before-manifest")
            manifest = {
                "kind": "compact",
                "output": output_name,
                "now": now,
                "roots": [[root, keys[root]] for root in roots],
                "partitions": partitions,
            }
            run.write_json(MANIFEST, manifest)
        maybe_fail(faults, "before-commit")
        t1 = _time.perf_counter()
        refused = commit(run, manifest, policy)
        result.seconds["commit"] = _time.perf_counter() - t1
        result.partitions = _with_refusals(manifest["partitions"], refused)
        result.seconds["total"] = _time.perf_counter() - started
        return result
    finally:
        for lock in locks:
            lock.release()


def _run_tasks(
    spark: Any,
    tasks: list[CompactTask],
    policy: Policy,
    now: int,
    run: RunDir,
    output: str | None,
    faults: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    if not tasks:
        return []
    sc = spark.sparkContext
    weighted = [(t, sum(size for _, size, _ in partition_fingerprint(t.ref))) for t in tasks]
    # One task per partition; the biggest start first.
    ordered = [t for t, _ in sorted(weighted, key=lambda tw: -tw[1])]
    # Each executor's tasks share the policy's maxIoBytesPerSecond.
    rate = task_io_rate(sc, policy.cleaner.max_io_bytes_per_second)
    shared_policy = sc.broadcast(dataclasses.replace(policy, cleaner=dataclasses.replace(
        policy.cleaner, max_io_bytes_per_second=rate)))  # fmt: skip
    run_root = (str(run.root), run.id)
    results = (
        sc.parallelize(ordered, len(ordered))
        .map(lambda t: compact_partition(t, shared_policy.value, now, RunDir(*run_root), output, faults))
        .collect()
    )
    return sorted(results, key=lambda r: (r["root"], r["topic"], r["partition"]))


# -- the task --------------------------------------------------------------------------------


def _inodes(directory: Path) -> dict[str, int]:
    with os.scandir(directory) as it:
        return {e.name: e.inode() for e in it if e.is_file(follow_symlinks=False)}


def segment_diff(before: Mapping[str, int], after: Mapping[str, int]) -> tuple[list[int], list[int], list[str]]:
    """(new segment bases, replaced segment bases, unexpected other changes) between two
    listings (name -> inode) of a partition directory. A segment is the same only if all
    of its files are the same files."""

    def bases(names: Iterable[str]) -> set[int]:
        return {b for n in names if n.endswith(LOG_SUFFIX) and (b := offset_of(n)) is not None}

    def files_of(listing: Mapping[str, int], base: int) -> tuple[int | None, ...]:
        return tuple(listing.get(file_name(base, kind)) for kind in SEGMENT_FILE_SUFFIXES)

    b_before, b_after = bases(before), bases(after)
    new = sorted(b for b in b_after if files_of(after, b) != files_of(before, b))
    replaced = sorted(b for b in b_before if b not in b_after or files_of(after, b) != files_of(before, b))
    segment_files = {file_name(b, k) for b in b_before | b_after for k in SEGMENT_FILE_SUFFIXES}
    gone = set(replaced) - set(new)
    unexpected = sorted(
        n
        for n in set(before) | set(after)
        if n not in segment_files
        and before.get(n) != after.get(n)
        # replace_segments removes the producer snapshots at the bases of replaced segments
        and not (n.endswith(".snapshot") and n not in after and offset_of(n) in gone)
    )
    return new, replaced, unexpected


def compact_partition(
    task: CompactTask, policy: Policy, now: int, run: RunDir, output: str | None, faults: Mapping[str, Any] | None
) -> dict[str, Any]:
    """One partition: the engine's clean of a private copy, staged - or, for an ``output``
    in object storage, made on this executor's disk and uploaded over the output's partition
    (``cleaner.spark.object_output``). A partition in object storage is read from its mirror
    on this host (``PartitionRef.localized``)."""
    ref = task.ref
    done = run.done / task.root_key / ref.tp.dir_name
    if (done / "result.json").exists():
        result = json.loads((done / "result.json").read_text())
        result["reused"] = True
        return result
    local = ref.localized()
    started = _time.perf_counter()
    maybe_fail(faults, "compact")
    clock = FixedTime(now)
    manager, managed = open_managed(local, policy, clock, read_only=True)
    report = manager.report(now)[0]
    the_log = managed.log
    segments = the_log.segments
    source_checkpoint = LogDirectory(local.root, read_only=True).cleaner_checkpoint.read().get(ref.tp)
    retention_possible = managed.rule.delete or (
        len(segments) > 1 and segments[1].base_offset <= the_log.log_start_offset
    )
    result: dict[str, Any] = {
        "root": ref.root,
        "rootKey": task.root_key,
        "sourceRoot": task.source_root,
        "topic": ref.topic,
        "partition": ref.partition,
        "eligible": report.eligible,
        "reason": report.reason,
        "firstDirtyOffset": report.first_dirty_offset,
        "bytesBefore": the_log.size_in_bytes,
        "bytesAfter": the_log.size_in_bytes,
        "rounds": 0,
        "recordsRead": 0,
        "recordsWritten": 0,
        "tombstonesRemoved": 0,
        "endOffset": source_checkpoint,
        "checkpoint": None,
        "changed": False,
        "newSegments": [],
        "replacedSegments": [],
        "unexpectedChanges": [],
        "sourceFiles": dir_fingerprint(local.path),
        "logStartOffset": the_log.log_start_offset,
        "uncleanable": None,
        "reused": False,
    }
    attempt = new_attempt_dir(run, f"{task.root_key}.{ref.tp.dir_name}")
    object_out = ObjectLogDir.parse(output) if output is not None and is_object_uri(output) else None
    scratch = attempt if object_out is None else Path(tempfile.mkdtemp(prefix="clean-", dir=scratch_base()))
    mini = scratch / "root"
    try:
        if report.eligible or retention_possible:
            result.update(_clean_copy(local, mini, policy, clock, source_checkpoint))
        else:
            result["action"] = "copied" if output is not None else "skipped"
            if output is not None and object_out is None:
                copy_tree(local.path, mini / ref.tp.dir_name)
        if object_out is not None:
            written = mini / ref.tp.dir_name if result["action"] != "copied" else local.path
            target = output_log_dir(object_out, task.root_key)
            result["outputObjects"] = upload_files(target, written, ref.tp.dir_name, exact=True)
    finally:
        if scratch != attempt:  # on this executor's disk: uploaded, or failed
            shutil.rmtree(scratch, ignore_errors=True)
    result["seconds"] = _time.perf_counter() - started
    files.atomic_write(attempt / "result.json", _json(result))
    finish_attempt(attempt, done)
    return result


def _clean_copy(
    local: PartitionRef, mini: Path, policy: Policy, clock: Time, source_checkpoint: int | None
) -> dict[str, Any]:
    """``kafka-cleaner clean`` of a copy of the partition in the private log dir ``mini``
    (with the log dir's root files); the result's fields it decides."""
    tp = local.tp
    mini.mkdir()
    with os.scandir(local.root) as it:
        for entry in it:
            if entry.is_file(follow_symlinks=False) and entry.name != LOCK_FILE:
                shutil.copy2(entry.path, mini / entry.name)
    copy_tree(local.path, mini / tp.dir_name)
    before = _inodes(mini / tp.dir_name)
    outcome = cleaning.clean([mini], policy, clock)
    after = _inodes(mini / tp.dir_name)
    new, replaced, unexpected = segment_diff(before, after)
    checkpoint = OffsetCheckpointFile(mini / CLEANER_OFFSET_CHECKPOINT).read().get(tp)
    uncleanable = [reason for tps in outcome.uncleanable.values() for reason in tps.values()]
    changed = checkpoint if checkpoint != source_checkpoint else None
    return {
        "action": "cleaned" if new or replaced or changed is not None else "unchanged",
        "changed": bool(new or replaced),
        "newSegments": new,
        "replacedSegments": replaced,
        "unexpectedChanges": unexpected,
        "rounds": len(outcome.results),
        "recordsRead": sum(r.stats.messages_read for r in outcome.results),
        "recordsWritten": sum(r.stats.messages_written for r in outcome.results),
        "tombstonesRemoved": sum(r.stats.tombstones_removed for r in outcome.results),
        "bytesAfter": outcome.bytes_after,
        "checkpoint": changed,
        "endOffset": checkpoint,
        "uncleanable": "; ".join(uncleanable) or None,
    }


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


# -- the commit ------------------------------------------------------------------------------


def commit(run: RunDir, manifest: Mapping[str, Any], policy: Policy) -> dict[str, str]:
    """Apply a manifest; safe to repeat after a crash at any point. Returns the partitions
    (``<root>/<partition>``) whose swap was refused, with why (their source is unchanged)."""
    checkpoints: dict[str, dict] = defaultdict(dict)
    for p in manifest["partitions"]:
        if p["checkpoint"] is not None:
            checkpoints[p["root"]][PartitionRef(p["root"], p["topic"], p["partition"]).tp] = p["checkpoint"]
    if manifest["output"] is not None and is_object_uri(manifest["output"]):
        return _commit_to_object_storage(run, manifest, checkpoints)
    if manifest["output"] is not None:
        out = Path(manifest["output"])
        for p in manifest["partitions"]:
            ref = PartitionRef(p["root"], p["topic"], p["partition"])
            staged = run.done / p["rootKey"] / ref.tp.dir_name / "root" / ref.tp.dir_name
            if staged.exists():  # else published before a crash
                publish_dir(staged, out / p["rootKey"] / ref.tp.dir_name, run.path / "trash")
        for root, key in manifest["roots"]:
            if is_object_uri(root):  # its root files and partition names, on this host for the copy
                with tempfile.TemporaryDirectory(prefix="kafka-cleaner-root-") as tmp:
                    source = mirror(ObjectLogDir.parse(root), base=Path(tmp))
                    write_output_root(out / key, source, checkpoints.get(root, {}))
            else:
                write_output_root(out / key, root, checkpoints.get(root, {}))
    failed: dict[str, str] = {}
    if manifest["output"] is None:
        for p in manifest["partitions"]:
            if p["changed"]:
                ref = PartitionRef(p["root"], p["topic"], p["partition"])
                try:
                    _apply_in_place(run, p, policy)
                except StalePlanError as e:
                    log.error("not committed: %s", e)
                    failed[str(ref.path)] = f"not committed: {e}"
                    checkpoints[p["root"]].pop(ref.tp, None)
        for root, _ in manifest["roots"]:
            update_cleaner_checkpoint(root, checkpoints.get(root, {}))
    refs = [PartitionRef(p["root"], p["topic"], p["partition"]) for p in manifest["partitions"]]
    if manifest["output"] is not None:
        out = Path(manifest["output"])
        roots = [out / key for _, key in manifest["roots"]]
        dirs = [out / p["rootKey"] / ref.tp.dir_name for p, ref in zip(manifest["partitions"], refs, strict=True)]
    else:
        roots = [root for root, _ in manifest["roots"]]
        dirs = [ref.path for ref in refs]
    identity = commit_identity(roots, dirs)
    run.mark_committed({"partitions": len(refs), "notCommitted": failed, "identity": identity})
    run.clean_up()
    return failed


def _commit_to_object_storage(run: RunDir, manifest: Mapping[str, Any], checkpoints: Mapping[str, dict]) -> dict:
    """The tasks uploaded the partitions; the root files of each output log dir (the output's
    ``cleaner-offset-checkpoint``, if it has one, updated as on a file system), then
    ``_SUCCESS``, last."""
    out = ObjectLogDir.parse(manifest["output"])
    written: dict[str, list[str]] = {}
    for root, key in manifest["roots"]:
        target = output_log_dir(out, key)
        with tempfile.TemporaryDirectory(prefix="kafka-cleaner-root-") as tmp:
            source = mirror(ObjectLogDir.parse(root), base=Path(tmp) / "in") if is_object_uri(root) else root
            staged = Path(tmp) / "out"
            staged.mkdir()
            fetch_root_file(target, CLEANER_OFFSET_CHECKPOINT, staged / CLEANER_OFFSET_CHECKPOINT)
            write_output_root(staged, source, checkpoints.get(root, {}))
            upload_files(target, staged, exact=False)
        written[target.uri] = [
            PartitionRef(p["root"], p["topic"], p["partition"]).tp.dir_name
            for p in manifest["partitions"]
            if p["rootKey"] == key
        ]
    identity = output_identity(written)
    write_success(out, run.id, identity)
    run.mark_committed({"partitions": len(manifest["partitions"]), "notCommitted": {}, "identity": identity})
    run.clean_up()
    return {}


def _holds(run: RunDir, object_out: ObjectLogDir | None) -> bool:
    """Whether the run's committed output (or its paths, in place) still holds what the
    commit left: a restore or another writer makes the run plan again."""
    identity = (run.read_json(COMMITTED) or {}).get("identity")
    if object_out is not None:
        return bool(identity) and holds_output(object_out, run.id, identity)
    return holds_commit(identity)


def _with_refusals(partitions: list[dict[str, Any]], refused: Mapping[str, str]) -> list[dict[str, Any]]:
    """A refused swap is reported like an uncleanable partition (exit code 3)."""
    out = []
    for p in partitions:
        reason = refused.get(str(PartitionRef(p["root"], p["topic"], p["partition"]).path))
        out.append({**p, "uncleanable": reason} if reason else p)
    return out


def _apply_in_place(run: RunDir, p: Mapping[str, Any], policy: Policy) -> None:
    ref = PartitionRef(p["root"], p["topic"], p["partition"])
    marker = run.path / "applied" / f"{p['rootKey']}.{ref.tp.dir_name}"
    if marker.exists():
        return
    if p["unexpectedChanges"]:
        raise StalePlanError(f"{ref.path}: the clean changed files the swap cannot carry: {p['unexpectedChanges']}")
    rule = policy.rule_for(ref.topic)
    if rule is None:
        raise StalePlanError(f"{ref.path}: no policy rule matches topic {ref.topic!r}")
    staged_dir = run.done / p["rootKey"] / ref.tp.dir_name / "root" / ref.tp.dir_name
    staged = staged_segments(staged_dir, p["newSegments"])
    the_log = open_for_commit(ref.path, rule, p["logStartOffset"])
    if not swap_applied(ref.path, staged, p["replacedSegments"]):
        current = [list(x) for x in dir_fingerprint(ref.path)]
        if current != [list(x) for x in p["sourceFiles"]]:
            raise StalePlanError(f"{ref.path}: the partition changed since its task ran")
        swap_in(the_log, staged, p["replacedSegments"])
    marker.parent.mkdir(parents=True, exist_ok=True)
    files.write_file(marker, b"")


def _resume_in_place(staging_root: Path, roots: Sequence[str], policy: Policy) -> CompactResult | None:
    """Finish the commit of earlier in-place runs over these log dirs that were killed
    after their job succeeded; returns the last one's result."""
    if not staging_root.is_dir():
        return None
    resumed = None
    for d in sorted(staging_root.iterdir()):
        if not d.name.startswith("compact-"):
            continue
        run = RunDir(staging_root, d.name)
        manifest = run.read_json(MANIFEST)
        if manifest is None or run.committed or manifest.get("kind") != "compact" or manifest.get("output"):
            continue
        if not {root for root, _ in manifest["roots"]} & set(roots):
            continue
        log.warning("completing the commit of interrupted run %s", run.id)
        refused = commit(run, manifest, policy)
        resumed = CompactResult(run.id, "committed", _with_refusals(manifest["partitions"], refused))
    return resumed
