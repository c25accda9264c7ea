"""Exactly-once output of the Spark jobs.

A job's plan has an id (``plan.run_id``: the inputs, their files' names, sizes and mtimes,
the checkpoints, the policy and a fixed clock). Its files live under
``<staging>/<run id>/``::

    plan.json         the plan's clock and inputs, written before any task runs (a rerun of
                      a killed job reuses its clock, so staged work stays valid)
    attempts/<uid>/   what one task attempt writes (uid: stage, partition, attempt number,
                      task attempt id and a random part: never shared by two attempts)
    done/...          finished units of work, each renamed from its attempt directory in one
                      atomic rename; the first attempt to finish wins, a later duplicate
                      (a retry after a lost result, a speculative copy) deletes its own
    MANIFEST.json     written by the driver once the Spark job succeeded: what to commit
    COMMITTED         written when the commit driven by the manifest is complete

Nothing the broker (or a reader of ``--output``) sees changes before the commit. A job
that fails or is killed leaves the source as it was; a rerun of the same plan finds its
``done/`` work (only missing units run again) or its manifest (only the commit runs
again), and a rerun after ``COMMITTED`` does nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cleaner.storage import files

STAGING_DIR_NAME = ".kafka-cleaner-spark"
PLAN = "plan.json"
MANIFEST = "MANIFEST.json"
COMMITTED = "COMMITTED"


class InjectedFault(RuntimeError):
    """Raised where a test asked for a failure (``faults``)."""


class RunDir:
    def __init__(self, staging_root: str | os.PathLike[str], run_id: str) -> None:
        self.root = Path(staging_root)
        self.id = run_id
        self.path = self.root / run_id

    @property
    def attempts(self) -> Path:
        return self.path / "attempts"

    @property
    def done(self) -> Path:
        return self.path / "done"

    @property
    def committed(self) -> bool:
        return (self.path / COMMITTED).exists()

    def create(self) -> None:
        for d in (self.attempts, self.done):
            d.mkdir(parents=True, exist_ok=True)

    # -- small JSON files, written atomically ------------------------------------------------
    def read_json(self, name: str) -> Any | None:
        try:
            return json.loads((self.path / name).read_text())
        except FileNotFoundError:
            return None

    def write_json(self, name: str, value: Any) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        files.atomic_write(self.path / name, json.dumps(value, indent=1, sort_keys=True).encode())

    def mark_committed(self, summary: Mapping[str, Any]) -> None:
        self.write_json(COMMITTED, dict(summary))

    def clean_up(self) -> None:
        """After the commit: only the plan, the manifest and the COMMITTED marker stay (a
        rerun of the plan then knows there is nothing to do)."""
        for d in (self.attempts, self.done, self.path / "publish", self.path / "trash"):
            shutil.rmtree(d, ignore_errors=True)


def new_attempt_dir(run: RunDir, what: str) -> Path:
    """A directory no other task attempt uses."""
    uid = attempt_uid()
    d = run.attempts / f"{what}.{uid}"
    d.mkdir(parents=True)
    return d


def attempt_uid() -> str:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except ImportError:  # pragma: no cover - pyspark is an extra
        ctx = None
    spark_part = (
        f"s{ctx.stageId()}p{ctx.partitionId()}a{ctx.attemptNumber()}t{ctx.taskAttemptId()}" if ctx else "driver"
    )
    return f"{spark_part}-{uuid.uuid4().hex[:12]}"


def finish_attempt(attempt: Path, done: Path) -> bool:
    """Rename a finished attempt directory to its place in ``done/``. True if this attempt
    won; False if an earlier attempt of the same unit already finished (this one's files
    are removed: both are the same bytes, the work being deterministic)."""
    done.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(attempt, done)
    except OSError:
        if done.exists():
            shutil.rmtree(attempt, ignore_errors=True)
            return False
        raise
    files.fsync_dir(done.parent)
    return True


def copy_tree(src: Path, dst: Path) -> None:
    """A copy of a directory of regular files with their mtimes (``copy2``), fsynced."""
    dst.mkdir(parents=True, exist_ok=True)
    with os.scandir(src) as it:
        for entry in it:
            if entry.is_file(follow_symlinks=False):
                shutil.copy2(entry.path, dst / entry.name)
                files.fsync_file(dst / entry.name)
            elif entry.is_dir(follow_symlinks=False):
                copy_tree(Path(entry.path), dst / entry.name)
    files.fsync_dir(dst)


def publish_dir(new: Path, final: Path, trash: Path) -> None:
    """Put the directory ``new`` at ``final`` (replacing what is there) with renames only:
    an older ``final`` is first moved into ``trash``. Re-running after a crash at any point
    completes it: ``new`` exists until its own rename, which is the last step."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        trash.mkdir(parents=True, exist_ok=True)
        aside = trash / f"{final.name}.{uuid.uuid4().hex[:8]}"
        os.rename(final, aside)
    os.rename(new, final)
    files.fsync_dir(final.parent)
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)


# -- faults for tests ------------------------------------------------------------------------


def maybe_fail(faults: Mapping[str, Any] | None, point: str) -> None:
    """Fault injection: ``faults = {"fail_once": {"point": P, "marker": FILE}}`` (or a list
    of such) makes the first task reaching point P fail (the marker file, on storage every
    executor sees, records that it happened, so the retry succeeds); ``{"fail": P}`` fails
    at P every time (a job or driver that dies there); ``{"hold": {"point": P, "until": FILE}}``
    holds every task reaching P until FILE exists (a test kills what it wants meanwhile, and
    does not race the job to it), failing after ``within_s`` (300) seconds without it.

    Points: ``phase1`` (a map task), ``phase2`` (a group's rewrite, after its segment is
    written, before it is staged), ``compact`` (a partition's task), ``before-manifest`` and
    ``before-commit`` (the driver)."""
    if not faults:
        return
    if faults.get("fail") == point:
        raise InjectedFault(f"injected failure at {point}")
    hold = faults.get("hold") or {}
    if hold.get("point") == point:
        release, deadline = Path(hold["until"]), time.monotonic() + float(hold.get("within_s", 300))
        while not release.exists():
            if time.monotonic() > deadline:
                raise InjectedFault(f"held at {point}: {release} did not appear")
            time.sleep(0.05)
    once = faults.get("fail_once") or []
    for spec in [once] if isinstance(once, Mapping) else once:
        if spec.get("point") != point:
            continue
        try:
            fd = os.open(Path(spec["marker"]), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        raise InjectedFault(f"injected failure at {point} (once)")
