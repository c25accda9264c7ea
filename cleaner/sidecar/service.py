"""The sidecar service: one loop that reloads the policy, expands the log dirs, runs the
mode's work and scans; plus the HTTP endpoints.

**The start-up gate.** In a pod the native sidecar starts before the broker. Whatever the
mode, it takes no lock and changes no file before its gate has run, and the gate is the
only moment (with the pod's termination) at which it acts on a stopped broker's files:

- ``stage``: the fenced commit of every staged set (``stage.commit_log_dir``), bounded by
  ``stage.maxCommitSeconds``;
- ``compact``: one pass of the cleaner over the log dirs whose ``.lock`` it can take,
  bounded by ``compact.maxGateSeconds`` (an unfinished clean aborts, as Kafka's would);
- ``observe``: nothing.

``/startupz`` answers 200 once the gate is open (503 before): the sidecar container's
startupProbe, which holds the broker container until then. A broker restarted in place
(the sidecar keeps running) meets no gate, and nothing is committed or compacted for it.

The modes after the gate:

- ``observe``: read only. Scans reuse everything that did not change: a closed segment
  whose file is unchanged is not read again; the active segment is read from where the
  previous scan stopped. Scans are throttled by ``maxIoBytesPerSecond``.
- ``compact``: the engine's ``LogCleaner`` over the log dirs whose ``.lock`` it can take,
  only inside a maintenance window (``compact.windows``), holding the locks only while a
  pass runs. While a broker holds a lock the state is ``waitingForBroker``.
- ``stage``: stages next to the live broker where it never looks (``cleaner.sidecar.stage``),
  refuses what the guards refuse (``cleaner.sidecar.guards``), and commits at SIGTERM when
  the broker has exited (the pod's termination: native sidecars stop after the broker).

Every ``tick`` is driven by the injected clock, so tests run hours of scans in
milliseconds with a ``MockTime``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from time import monotonic
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cleaner import __version__, cleaning
from cleaner.clock import StoppableTime, Time
from cleaner.config import Mode, Policy
from cleaner.deletion import DeletionCache, at_risk
from cleaner.engine.cleaner import Cleaner
from cleaner.engine.log_cleaner import CleanResult, LogCleaner
from cleaner.engine.manager import LogCleanerManager, ManagedLog
from cleaner.engine.next_clean import NextCleanCache
from cleaner.engine.offset_map import OffsetMap
from cleaner.engine.throttler import Throttler
from cleaner.errors import FileChangedError, KafkaCleanerError, LogDirLockedError, ThreadShutdownError
from cleaner.in_sync import InSync, in_sync
from cleaner.storage.lock import LogDirLock
from cleaner.storage.log_dir import LogDirectory, checkpoints_read_once
from cleaner.storage.topic_partition import TopicPartition
from cleaner.windows import in_window

from . import stage
from .facts import ScanFactsCache
from .guards import CommitCheck, config_unwanted, mode_refusal, refusals
from .logdirs import duplicate_partitions, expand_log_dirs
from .metrics import CleanerGauges, SidecarMetrics, failure_kind
from .policy_watch import PolicyWatcher
from .report import LogDirInfo, ScanSnapshot, build_status, rfc3339
from .where_http import WhereEndpoint

log = logging.getLogger("cleaner.sidecar")

POLICY_POLL_MS = 2_000
MAX_LOOP_BACKOFF_MS = 60_000
"""The longest wait after a turn of the loop that raised (the wait doubles from twice the
turn's, while turns keep failing); a turn that works resets it."""


@dataclass
class SidecarOptions:
    policy_path: Path
    log_dir_patterns: list[str]
    broker_name: str = "kafka"
    listen: tuple[str, int] = ("0.0.0.0", 9410)
    scan_interval_ms: int | None = None
    """Default: the policy's ``reporting.intervalSeconds``."""
    gate: bool = True
    """False (``--no-gate``): a sidecar that does not start before the broker (a regular
    container, Kubernetes < 1.29) has no gate to run: it opens at once, commits and compacts
    nothing at start."""


@dataclass
class _Error:
    at_ms: int
    log_dir: str | None
    partition: str | None
    message: str

    def as_status(self) -> dict[str, Any]:
        return {"at": rfc3339(self.at_ms), "logDir": self.log_dir, "partition": self.partition, "message": self.message}


@dataclass
class _State:
    state: str = "starting"
    last_run_ms: int | None = None
    bytes_reclaimed: int = 0
    last_cleaned_at: dict[TopicPartition, int] = field(default_factory=dict)


@dataclass
class _Gate:
    """The start-up gate: ``pending`` -> ``running`` -> ``open`` (see the module docstring)."""

    state: str = "pending"
    started_at_ms: int | None = None
    opened_at_ms: int | None = None
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return self.state == "open"

    def as_status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "startedAt": rfc3339(self.started_at_ms),
            "openedAt": rfc3339(self.opened_at_ms),
            **self.result,
        }


class Sidecar:
    def __init__(self, options: SidecarOptions, time: Time) -> None:
        self.options = options
        self.time = time
        self.watcher = PolicyWatcher(options.policy_path)
        self.policy: Policy | None = None
        self.log_dirs: list[Path] = []
        self.facts = ScanFactsCache()
        self._deletion: DeletionCache | None = None
        self.next_clean = NextCleanCache()
        self.errors: deque[_Error] = deque(maxlen=20)
        self.snapshot: ScanSnapshot | None = None
        self.state = _State()
        self.gate = _Gate()
        self.duplicates: dict[TopicPartition, list[Path]] = {}
        self.refusal: str | None = None
        """Why the policy's writing mode may not run as this uid (``guards.mode_refusal``):
        its work is held (observing goes on) and ``/status`` says why."""
        self._refusal_for: tuple[str, tuple[Path, ...]] | None = None
        self._gate_deadline_ns = 0
        self._gate_discards = 0
        """Staged sets discarded before the gate opened (a deleted policy, another mode)."""
        self._policy_gone = False
        self.ready = False
        self.stopping = threading.Event()
        self._lock = threading.RLock()
        self._observer: LogCleanerManager | None = None
        self._observer_dirs: list[Path] = []
        self._next_scan_ms = 0
        self._next_policy_poll_ms = 0
        self._suspects: dict[tuple[str, TopicPartition], str] = {}
        self._controller: _Controller | None = None
        self._loop_alive = True
        self.metrics = SidecarMetrics(
            lambda: self.snapshot, self._gauges, self._per_partition_metrics, self._max_partition_series
        )
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self.where = WhereEndpoint()
        """``GET /where``: the key's records on this broker's disk (the operator's ``where``)."""

    # -- the loop --------------------------------------------------------------------------
    def tick(self) -> None:
        """One turn of the loop: policy, log dirs, the gate or the mode's work, and a scan
        when due."""
        now = self.time.milliseconds()
        if now >= self._next_policy_poll_ms or self.policy is None:
            self._next_policy_poll_ms = now + POLICY_POLL_MS
            self._poll_policy()
        if self.policy is None:
            if not self.gate.open and self.watcher.error is not None:
                # Nothing to commit without a policy: never hold the broker back for it. A
                # deleted policy (the file is gone) wants no staged set: they go.
                if self.watcher.missing:
                    dirs, _ = expand_log_dirs(self.options.log_dir_patterns)
                    self._discard_stage_sets(dirs, "policyGone", "the policy file is gone (a deleted policy)")
                self._open_gate(now, {"skipped": f"no policy: {self.watcher.error}"})
            return
        dirs, missing = expand_log_dirs(self.options.log_dir_patterns)
        for pattern in missing:
            self._error(None, None, f"--log-dir {pattern} matches no Kafka log dir (yet)", dedupe=True)
        if dirs != self.log_dirs:
            self.log_dirs = dirs
            self._observer = None
        self.duplicates = duplicate_partitions(dirs)
        for tp, where in self.duplicates.items():
            self._error(
                None,
                str(tp),
                f"{tp} is in more than one log dir ({', '.join(map(str, where))}): Kafka refuses to start on this; "
                "neither copy is touched",
                dedupe=True,
            )
        self._check_mode_allowed(dirs)
        if self._controller is not None:
            try:
                if self.refusal is not None:
                    self._refused_step(now)
                elif not self.gate.open:
                    self._gate_step(now)
                elif self._policy_gone:
                    self.state.state = "idle"
                elif self.policy.paused:
                    self.state.state = "paused"
                    self._controller.pause(now)
                else:
                    self._controller.step(now)
            except Exception as e:
                log.exception("mode %s failed", self.policy.mode)
                self.metrics.loop_errors.labels("mode").inc()
                self._error(None, None, f"{self.policy.mode} mode: {type(e).__name__}: {e}")
                self.state.state = "error"
                if not self.gate.open:
                    self._open_gate(now, {"error": f"{type(e).__name__}: {e}"})
        if now >= self._next_scan_ms:
            self._next_scan_ms = now + self._scan_interval_ms()
            try:
                self.scan()
            except Exception as e:  # what scan() itself does not expect: a bug; the next scan runs
                self._loop_error("scan", e)

    def _check_mode_allowed(self, dirs: list[Path]) -> None:
        """``guards.mode_refusal`` when the mode or the log dirs changed (the broker may
        create its log dirs after the sidecar starts)."""
        assert self.policy is not None
        key = (str(self.policy.mode), tuple(dirs))
        if key == self._refusal_for:
            return
        self._refusal_for = key
        self.refusal = mode_refusal(Mode(self.policy.mode), dirs) if dirs else None
        if self.refusal is not None:
            self._error(None, None, self.refusal, dedupe=True)

    def _refused_step(self, now: int) -> None:
        """A refused mode does nothing but hand everything back (``pause``: no lock held, no
        pass running); the gate opens at once, since the broker must never wait for it."""
        assert self._controller is not None
        if self._controller.held_locks():  # a compact pass, when the refusal came later (a new dir)
            self._controller.pause(now)
        self.state.state = "error"
        if not self.gate.open:
            self._open_gate(now, {"skipped": self.refusal})

    def _gate_step(self, now: int) -> None:
        assert self._controller is not None and self.policy is not None
        if not self.options.gate:
            self._open_gate(now, {"skipped": "--no-gate: the sidecar does not start before the broker"})
            return
        if self.gate.state == "pending":
            self.gate.state = "running"
            self.gate.started_at_ms = now
            self._gate_deadline_ns = self.time.nanoseconds() + self._controller.gate_seconds() * 1_000_000_000
            if not isinstance(self._controller, _StageController):
                # Sets a stage-mode policy left: no other mode commits (or validates) them.
                mode = self.policy.mode
                self._discard_stage_sets(self.log_dirs, "notStageMode", f"the policy is in {mode} mode, not stage")
        if self.policy.paused:
            self._controller.pause(now)
            self.state.state = "paused"
            result: dict[str, Any] = {"skipped": "the policy is paused"}
            if isinstance(self._controller, _StageController):
                # A paused policy commits nothing, and its sets go: the commit's check (the
                # policy file as it is now) discards each set it does not want.
                result["discarded"] = self._controller.commit(self._gate_deadline_ns, "gate")["discarded"]
            self._open_gate(now, result)
            return
        result = self._controller.gate_step(self._gate_deadline_ns)
        if result is not None:
            self._open_gate(now, result)

    def _discard_stage_sets(self, dirs: list[Path], code: str, why: str) -> int:
        """Delete every staged set (and unfinished round) in ``dirs``, which the policy in
        force does not want (deleting is always safe: the broker never read them); returns
        how many sets went, each logged, reported and counted."""
        n = 0
        for d in dirs:
            for tp, pdir in stage.staged_partitions(d).items():
                had_set = stage.load(pdir) is not None
                try:
                    stage.delete_set(pdir)
                except OSError as e:
                    self._error(str(d), str(tp), f"cannot delete the staged set: {e}")
                    continue
                if had_set:
                    n += 1
                    self.metrics.stage_sets_discarded.labels(code).inc()
                    self._error(str(d), str(tp), f"discarded the staged set, not committed: {why}")
        self._gate_discards += n
        return n

    def _open_gate(self, now: int, result: dict[str, Any]) -> None:
        if self._gate_discards and "discarded" not in result:
            result = {**result, "discarded": self._gate_discards}
        self.gate.state = "open"
        self.gate.started_at_ms = self.gate.started_at_ms or now
        self.gate.opened_at_ms = self.time.milliseconds()
        self.gate.result = result
        log.info("start-up gate open: %s", json.dumps(result, separators=(",", ":"))[:2000])
        self._next_scan_ms = 0

    def _scan_interval_ms(self) -> int:
        if self.options.scan_interval_ms is not None:
            return self.options.scan_interval_ms
        assert self.policy is not None
        return self.policy.reporting.interval_seconds * 1000

    def _poll_policy(self) -> None:
        new = self.watcher.poll()
        if self.watcher.error:
            self._error(None, None, f"policy: {self.watcher.error}", dedupe=True)
        if self.watcher.missing and not self._policy_gone and self._controller is not None:
            # A deleted policy: its work stops, and stage mode's sets go (never committed).
            self._policy_gone = True
            log.warning("the policy file is gone: the %s mode's work stops", self.policy.mode if self.policy else "-")
            self._controller.policy_gone()
        if new is None:
            return
        old = self.policy
        if self._policy_gone:
            self._policy_gone = False
            old = None  # back: start the mode afresh
        self.policy = new
        self._observer = None
        log.info("policy loaded (generation %s, mode %s)", new.policy_generation, new.mode)
        if old is None or old.mode != new.mode:
            if old is not None:
                log.info("mode %s -> %s", old.mode, new.mode)
            self._switch_mode(new)
        elif self._controller is not None:
            self._controller.reconfigure(new, cleaner_changed=old.cleaner != new.cleaner)

    def _switch_mode(self, policy: Policy) -> None:
        if self._controller is not None:
            self._controller.stop(leaving_mode=True)
        controllers = {Mode.OBSERVE: _Controller, Mode.COMPACT: _CompactController, Mode.STAGE: _StageController}
        self._controller = controllers[Mode(policy.mode)](self)
        self.state.state = self._controller.idle_state

    def scan(self) -> ScanSnapshot | None:
        """A read-only look at every log dir; what ``/status`` and ``/metrics`` report. The
        broker's checkpoint files are read once a scan (``checkpoints_read_once``)."""
        with checkpoints_read_once():
            return self._scan()

    def _scan(self) -> ScanSnapshot | None:
        policy = self.policy
        if policy is None:
            return None
        now = self.time.milliseconds()
        busy = self._controller.busy_dirs() if self._controller is not None else set()
        scan_dirs = [d for d in self.log_dirs if d not in busy]
        if self._observer is None or self._observer_dirs != scan_dirs:
            self._observer = LogCleanerManager(
                [LogDirectory(d, read_only=True) for d in scan_dirs], policy, self.time, write_checkpoints=False
            )
            self._observer_dirs = scan_dirs
        observer = self._observer
        throttler = Throttler(policy.cleaner.max_io_bytes_per_second, StoppableTime(self.time, self.stopping))

        def throttle(n: int) -> None:
            # A long (or throttled) scan must not hold up SIGTERM: stop reading at once.
            if self.stopping.is_set():
                raise ThreadShutdownError("the sidecar is stopping")
            throttler.maybe_throttle(n)

        deletion = self._deletion_cache(policy)
        before, deletion_before = self.facts.bytes_read, deletion.bytes_read
        self.facts.start_scan()
        previous = self.snapshot
        failed = False
        try:
            self._refresh_observed(observer)
            statuses = cleaning.status(
                scan_dirs,
                policy,
                self.time,
                facts_cache=self.facts,
                manager=observer,
                throttle=throttle,
                # The estimate reads every record of the cleanable section (throttled like
                # the scan). In observe mode that is the point; in compact and stage modes it
                # would hold up the cleaning it predicts, whose own figures then answer.
                next_clean=self.next_clean if policy.mode == Mode.OBSERVE else None,
                replicas=True,
                deletion=deletion,
            )
        except ThreadShutdownError:
            return self.snapshot  # the sidecar is stopping
        except Exception as e:
            # The scan as a whole (what every partition shares: the log dir's listing, its
            # checkpoints): the partitions keep their previous picture, and the scan's time.
            self._loop_error("scan", e)
            failed = True
            statuses = list(previous.statuses) if previous is not None else []
        self.facts.forget_missing()
        self.metrics.scan_bytes_read.inc(self.facts.bytes_read - before)
        self.metrics.deletion_bytes_read.inc(deletion.bytes_read - deletion_before)
        if not failed:
            self._count_failures(statuses)
            statuses = self._settle_failures(statuses)
            kept = {s.report.topic_partition: s for s in (previous.statuses if previous is not None else [])}
            for d in busy:  # a dir being cleaned keeps its previous picture until the pass ends
                statuses += [s for s in kept.values() if s.report.log_dir == str(d)]
        snapshot = ScanSnapshot(
            previous.scanned_at_ms if failed and previous is not None else now,
            statuses,
            self._log_dir_infos(statuses, observer),
            self._controller.staged_bytes() if self._controller else {},
            previous.in_sync if failed and previous is not None else self._in_sync(observer),
        )
        with self._lock:
            self.snapshot = snapshot
            # Ready: a policy and at least one log dir seen (a sidecar that finds none is
            # not doing its job, whatever the reason).
            self.ready = bool(self.log_dirs)
        return snapshot

    def _in_sync(self, observer: LogCleanerManager) -> InSync | None:
        """This broker's place in the ISRs, from the metadata the scan's manager just read
        (what a Paced rollout waits for: ``cleaner.in_sync``)."""
        if observer.cluster_metadata is None or observer.broker_id is None:
            return None
        try:
            return in_sync(observer.cluster_metadata, observer.broker_id)
        except Exception as e:  # one section of the report never costs the scan
            self._loop_error("scan", e)
            return None

    def _deletion_cache(self, policy: Policy) -> DeletionCache:
        """The deletion facts' cache, kept across scans (a new one when the policy resizes it)."""
        wanted = DeletionCache.for_policy(policy, deadlines_only=True)
        known = self._deletion
        if known is None or known.sizing != wanted.sizing:
            self._deletion = wanted
        return self._deletion

    def _count_failures(self, statuses: list[cleaning.PartitionStatus]) -> None:
        """``scan_failures_total{reason}``: each partition whose look failed in this scan,
        once, by its first failure (its own status and ``errors`` say what it was)."""
        for s in statuses:
            r = s.report
            error = s.error or self.facts.errors.get(Path(r.log_dir) / r.topic_partition.dir_name)
            if error is None and s.replica is not None:
                error = s.replica.probe_error
            if error is not None:
                self.metrics.scan_failures.labels(failure_kind(error)).inc()

    def _loop_error(self, step: str, error: Exception) -> None:
        """An exception the loop goes on after: logged (with its traceback when it is not
        one of ours: a bug), counted in ``loop_errors_total{step}``, and in ``/status``."""
        if isinstance(error, (KafkaCleanerError, OSError)) and step != "scan":
            log.warning("%s failed: %s", step, error)
        else:  # a whole scan failing is a partition's failure that got out: where from
            log.exception("%s failed", step)
        self.metrics.loop_errors.labels(step).inc()
        what = "scan failed" if step == "scan" else f"the loop's turn failed ({type(error).__name__})"
        self._error(None, None, f"{what}: {error}", dedupe=True)

    def _refresh_observed(self, observer: LogCleanerManager) -> None:
        """Look again at every observed log. Partitions that went away (topic deletion, a
        reassignment to another broker, a dir removed by hand) are forgotten first, and a
        partition that cannot be refreshed is reported alone: neither may stop the scan of
        the others."""
        for tp, managed in observer.logs().items():
            try:
                managed.log.refresh()
            except FileNotFoundError:
                pass  # gone, or changing under our eyes: the next scan sees which
            except (KafkaCleanerError, OSError) as e:
                self._error(str(managed.log_dir), str(tp), f"cannot refresh: {e}", dedupe=True)

    def _settle_failures(self, statuses: list[cleaning.PartitionStatus]) -> list[cleaning.PartitionStatus]:
        """Partitions a compact pass marked uncleanable, and those whose look failed in this
        scan (unreadable segments, a report that raised), are reported as uncleanable
        (Kafka's ``uncleanable-partitions``) and in ``errors``.

        The broker changes the files while a scan reads them (retention renames a segment
        away, a truncation shortens one), so a failed look is a *suspect* first: it is
        reported once the next scan fails too, and meanwhile the partition keeps its
        previous picture. A partition seen for the first time is reported at once (there
        is no better picture to show)."""
        marked = self._controller.uncleanable() if self._controller is not None else {}
        previous = {
            (s.report.log_dir, s.report.topic_partition): s for s in (self.snapshot.statuses if self.snapshot else [])
        }
        suspects: dict[tuple[str, TopicPartition], str] = {}
        out = []
        for s in statuses:
            r = s.report
            key = (r.log_dir, r.topic_partition)
            why = marked.get(key)
            if why is None:
                why = self.facts.failures.get(Path(r.log_dir) / r.topic_partition.dir_name)
                if why is None and r.reason == "uncleanable":
                    why = r.uncleanable_reason
                if why is not None:
                    suspects[key] = why
                    if key not in self._suspects and key in previous:
                        out.append(previous[key])
                        continue
            if why is not None:
                if r.compacted:
                    r.reason, r.uncleanable_reason, r.eligible = "uncleanable", why, False
                self._error(r.log_dir, str(r.topic_partition), why, dedupe=True)
            out.append(s)
        self._suspects = suspects
        return out

    def _log_dir_infos(self, statuses: list, observer: LogCleanerManager) -> list[LogDirInfo]:
        infos = []
        for d in self.log_dirs:
            log_dir = LogDirectory(d, read_only=True)
            mine = [s for s in statuses if s.report.log_dir == str(d)]
            try:
                free, total = log_dir.free_bytes(), log_dir.total_bytes()
                held = log_dir.is_locked_by_broker() if not self._holds_lock(d) else False
            except OSError:
                free = total = 0
                held = None
            infos.append(
                LogDirInfo(
                    str(d),
                    len(mine),
                    held,
                    free,
                    total,
                    uncleanable_partitions=sum(1 for s in mine if s.report.reason == "uncleanable"),
                    uncleanable_bytes=sum(s.report.cleanable_bytes for s in mine if s.report.reason == "uncleanable"),
                )
            )
        return infos

    def _holds_lock(self, d: Path) -> bool:
        return self._controller is not None and d in self._controller.held_locks()

    def _error(self, log_dir: str | None, partition: str | None, message: str, *, dedupe: bool = False) -> None:
        """An error for ``/status`` and the log (once per distinct message when ``dedupe``)."""
        with self._lock:
            if dedupe and any(e.message == message and e.partition == partition for e in self.errors):
                return
            self.errors.append(_Error(self.time.milliseconds(), log_dir, partition, message))
        where = " ".join(x for x in (log_dir, partition) if x)
        log.warning("%s%s", f"{where}: " if where else "", message)

    # -- reports ---------------------------------------------------------------------------
    def status_document(self) -> dict[str, Any]:
        policy = self.policy
        controller = self._controller
        gauges = self._gauges()
        snap = self.snapshot
        cleaner_info = {
            "threads": policy.cleaner.threads if policy else 0,
            "deadThreads": gauges.dead_threads,
            "lastRunAt": rfc3339(self.state.last_run_ms),
            "maxDirtyRatio": round(snap.max_dirty_ratio, 6) if snap else 0.0,
            "maxCompactionDelaySeconds": (snap.max_compaction_delay_ms / 1000.0) if snap else 0.0,
            "bytesReclaimedTotal": self.state.bytes_reclaimed,
            "stagedBytes": sum(controller.staged_bytes().values()) if controller else 0,
            "state": self.state.state,
        }
        with self._lock:
            errors = [e.as_status() for e in self.errors]
        doc = build_status(
            broker=self.options.broker_name,
            mode=str(policy.mode) if policy else "observe",
            policy_generation=policy.policy_generation if policy else None,
            snapshot=snap,
            cleaner=cleaner_info,
            errors=errors,
            top_partitions=policy.reporting.top_partitions if policy else 20,
            last_cleaned_at=self.state.last_cleaned_at,
        )
        doc["gate"] = self.gate.as_status()
        warnings = self.warnings()
        if warnings:
            doc["warnings"] = warnings
        if controller is not None:
            extra = controller.status_section()
            if extra:
                doc.update(extra)
        return doc

    def warnings(self) -> list[str]:
        """What works, but not as the policy asked: a refused mode, fields ignored."""
        out = []
        if self.refusal is not None and self.policy is not None and self.policy.mode != Mode.OBSERVE:
            out.append(self.refusal[:1024])
        if self.watcher.unknown_fields:
            fields = ", ".join(self.watcher.unknown_fields)
            out.append(
                f"policy generation {self.policy.policy_generation if self.policy else None}: ignored fields this "
                f"sidecar ({__version__}) does not know: {fields}"[:1024]
            )
        return out

    def _gauges(self) -> CleanerGauges:
        g = CleanerGauges(policy_generation=self.policy.policy_generation if self.policy else None)
        if self._controller is not None:
            self._controller.fill_gauges(g)
        if self.state.last_run_ms is not None:
            g.time_since_last_run_seconds = max(self.time.milliseconds() - self.state.last_run_ms, 0) / 1000.0
        return g

    def _per_partition_metrics(self, topic: str) -> bool:
        rule = self.policy.rule_for(topic) if self.policy else None
        return bool(rule and rule.per_partition_metrics)

    def _max_partition_series(self) -> int:
        return self.policy.reporting.max_partition_series if self.policy else 0

    def healthy(self) -> bool:
        """The liveness probe's answer: false only when the sidecar's own loop has died, which
        nothing but a restart mends. Dead cleaner threads do not count: the next compact pass
        starts new threads anyway, and a restart would reset the counters the
        KafkaCleanerDeadThreads alert reads (``kafka_cleaner_cleaner_thread_deaths_total``), so
        the alert could never fire; ``/status`` names the error that killed them."""
        return self._loop_alive

    def record_clean(self, result: CleanResult) -> None:
        self.metrics.record_clean(result)
        self.state.last_cleaned_at[result.topic_partition] = self.time.milliseconds()
        self.state.bytes_reclaimed += max(result.stats.bytes_read - result.stats.bytes_written, 0)

    # -- running ---------------------------------------------------------------------------
    def serve(self) -> tuple[str, int]:
        """Start the HTTP server; returns the address it listens on."""
        self._server = _server_class(self.options.listen[0])(self.options.listen, _handler(self))
        self._server.daemon_threads = True
        t = threading.Thread(target=self._server.serve_forever, name="kafka-cleaner-http", daemon=True)
        t.start()
        self._threads.append(t)
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def run(self, tick_ms: int = 1_000) -> None:
        """The loop, until ``stop``; every turn waits ``tick_ms`` on the clock. No exception
        ends it: a turn that raises is logged, counted and reported (``_loop_error``), and
        the loop waits longer before the next (doubling, at most ``MAX_LOOP_BACKOFF_MS``),
        so a failure that does not go away is neither a busy loop nor a dead sidecar."""
        backoff_ms = 0
        try:
            while not self.stopping.is_set():
                try:
                    self.tick()
                    backoff_ms = 0
                except Exception as e:
                    self._loop_error("turn", e)
                    backoff_ms = min(max(backoff_ms, tick_ms) * 2, MAX_LOOP_BACKOFF_MS)
                self.time.wait(self.stopping, max(backoff_ms, tick_ms))
        except BaseException:
            self._loop_alive = False
            raise

    def stop(self) -> None:
        """Abort in-flight work, remove temporary files, release locks; in stage mode commit
        what is staged if the broker has exited (the lock decides); stop serving."""
        self.stopping.set()
        if self._controller is not None:
            self._controller.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _server_class(host: str) -> type[ThreadingHTTPServer]:
    """An IPv6 server for IPv6 hosts (``[::]:9410`` on IPv6-only clusters; ``::`` also
    accepts IPv4 where the kernel allows dual stack), the stdlib's IPv4 server otherwise."""
    if ":" not in host:
        return ThreadingHTTPServer

    class ThreadingHTTPServerV6(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    return ThreadingHTTPServerV6


def _handler(sidecar: Sidecar) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"kafka-cleaner/{__version__}"

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("http: " + fmt, *args)

        def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                ok = sidecar.healthy()
                self._send(
                    HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE,
                    b"ok\n" if ok else b"unhealthy\n",
                    "text/plain",
                )
            elif path == "/startupz":
                # The sidecar's startupProbe: the broker container starts once this is 200.
                ok = sidecar.gate.open
                self._send(
                    HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE,
                    b"gate open\n" if ok else f"gate {sidecar.gate.state}\n".encode(),
                    "text/plain",
                )
            elif path == "/readyz":
                ok = sidecar.ready and sidecar.policy is not None
                self._send(
                    HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE,
                    b"ready\n" if ok else b"not ready\n",
                    "text/plain",
                )
            elif path == "/metrics":
                self._send(HTTPStatus.OK, generate_latest(sidecar.metrics.registry), CONTENT_TYPE_LATEST)
            elif path == "/status":
                body = json.dumps(sidecar.status_document(), separators=(",", ":")).encode()
                self._send(HTTPStatus.OK, body, "application/json")
            elif path == "/where":
                query = self.path.split("?", 1)[1] if "?" in self.path else ""
                status, document = sidecar.where.answer(query, list(sidecar.log_dirs), sidecar.policy,
                                                        sidecar.time.milliseconds())
                self._send(status, json.dumps(document, separators=(",", ":")).encode(), "application/json")
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    return Handler


# -- the modes ------------------------------------------------------------------------------


def deletion_at_risk(snapshot: ScanSnapshot | None) -> dict[tuple[str, TopicPartition], int]:
    """The partitions of the last scan about to breach their deletion deadline (or past it)
    that a clean would help (what holds them back is the dirty ratio or no cleaner taking
    them), by (log dir, partition), with the time left: compact and stage mode clean them
    before the dirtiest (issue 25, item 3)."""
    out: dict[tuple[str, TopicPartition], int] = {}
    for s in snapshot.statuses if snapshot is not None else []:
        d = s.deletion
        if d is not None and at_risk(d) and d.held_back_by in ("cleaner", "dirtyRatio"):
            assert d.remaining_ms is not None
            out[(s.report.log_dir, s.report.topic_partition)] = d.remaining_ms
    return out


class _Controller:
    """Observe mode: nothing to do besides the scans; its gate opens at once."""

    idle_state = "observing"

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    def gate_seconds(self) -> int:
        return 0

    def gate_step(self, deadline_ns: int) -> dict[str, Any] | None:
        """Work of the start-up gate; the gate's result once it is done, None while not."""
        return {}

    def step(self, now: int) -> None:
        self.sidecar.state.state = self.idle_state

    def pause(self, now: int) -> None:
        """``spec.paused``: no cleaning, but whatever safety needs goes on."""

    def policy_gone(self) -> None:
        """The policy file was deleted: stop, and leave nothing behind."""
        self.stop(leaving_mode=True)

    def reconfigure(self, policy: Policy, *, cleaner_changed: bool) -> None:
        pass

    def stop(self, *, leaving_mode: bool = False) -> None:
        """``leaving_mode``: the policy switched to another mode (the process goes on);
        otherwise the sidecar is shutting down."""

    def uncleanable(self) -> dict[tuple[str, TopicPartition], str]:
        """Partitions this mode's work marked uncleanable: (log dir, partition) -> why."""
        return {}

    def busy_dirs(self) -> set[Path]:
        return set()

    def held_locks(self) -> set[Path]:
        return set()

    def staged_bytes(self) -> dict[TopicPartition, int]:
        return {}

    def fill_gauges(self, gauges: CleanerGauges) -> None:
        pass

    def status_section(self) -> dict[str, Any]:
        """Mode-specific top-level parts of ``/status``."""
        return {}


class _CompactController(_Controller):
    """Runs passes of the cleaner over the log dirs whose locks it can take: in the
    start-up gate (bounded by ``compact.maxGateSeconds``) and inside maintenance windows."""

    idle_state = "idle"

    def __init__(self, sidecar: Sidecar) -> None:
        super().__init__(sidecar)
        self.locks: dict[Path, LogDirLock] = {}
        self.pool: LogCleaner | None = None
        self.manager: LogCleanerManager | None = None
        self._next_attempt_ms = 0
        self._dead_threads = 0
        self._thread_deaths = 0
        """Threads of finished passes that died (the current pass's are added at scrape time)."""
        self._deaths_lock = threading.Lock()
        """A scrape never sees the counter dip (or double) while a pass ends: Prometheus would
        read a dip as a restart."""
        self._abort = threading.Event()
        """Set when the pass must end: a throttled thread stops sleeping."""
        self._marks: dict[tuple[str, TopicPartition], tuple[int, str]] = {}
        """Uncleanable partitions, kept from pass to pass as Kafka keeps them for the life
        of the process (each pass has a new manager): (log dir, partition) -> (inode of the
        partition dir, why). A partition dir that was deleted and re-created is a new log."""
        self._gate_started = False
        self._gate_cleaned = 0

    def gate_seconds(self) -> int:
        policy = self.sidecar.policy
        return policy.compact.max_gate_seconds if policy is not None else 0

    def gate_step(self, deadline_ns: int) -> dict[str, Any] | None:
        sc = self.sidecar
        if self.gate_seconds() == 0:
            return {"skipped": "compact.maxGateSeconds is 0"}
        if not self._gate_started:
            self._gate_started = True
            waiting = self._start_pass(sc.time.milliseconds())
            if self.pool is None:
                sc.state.state = "waitingForBroker" if waiting else "idle"
                return {"compacted": 0, "lockHeldByBroker": [str(d) for d in waiting]}
            return None
        assert self.pool is not None
        if any(t.is_alive() for t in self.pool.threads) and sc.time.nanoseconds() < deadline_ns:
            sc.state.state = "cleaning"
            return None
        timed_out = any(t.is_alive() for t in self.pool.threads)
        self._finish_pass()
        return {"compacted": self._gate_cleaned, "timedOut": timed_out}

    def _in_window(self, now: int) -> bool:
        policy = self.sidecar.policy
        return policy is not None and in_window(policy.compact.windows, now)

    def step(self, now: int) -> None:
        sc = self.sidecar
        assert sc.policy is not None
        if self.pool is not None:
            if not self._in_window(now):
                # The window closed: give the log dirs back at once (in-flight cleans abort).
                self._stop_pool(timeout_s=8.0)
                sc.state.state = "idle"
                sc._next_scan_ms = 0
                return
            if any(t.is_alive() for t in self.pool.threads):
                sc.state.state = "cleaning"
                return
            self._finish_pass()
        if not self._in_window(now):
            sc.state.state = "idle"
            return
        if now < self._next_attempt_ms:
            return
        waiting = self._start_pass(now)
        if self.pool is None:
            sc.state.state = "waitingForBroker" if waiting else "idle"
            self._next_attempt_ms = now + sc.policy.cleaner.backoff_ms

    def _start_pass(self, now: int) -> list[Path]:
        """Take every free lock and start a pass over those dirs; returns the dirs a broker
        holds. Dirs holding a partition that is also in another log dir are left alone."""
        sc = self.sidecar
        assert sc.policy is not None
        doubled = {d for dirs in sc.duplicates.values() for d in dirs}
        waiting = []
        for d in sc.log_dirs:
            if d in doubled:
                continue
            lock = LogDirLock(d)
            try:
                lock.acquire()
            except LogDirLockedError:
                waiting.append(d)
                continue
            self.locks[d] = lock
        if not self.locks:
            return waiting
        dirs = [LogDirectory(d) for d in self.locks]
        self.manager = LogCleanerManager(dirs, sc.policy, sc.time)
        by_path = {str(d): d for d in dirs}
        self.manager.deletion_at_risk = {
            tp: left for (log_dir, tp), left in deletion_at_risk(sc.snapshot).items() if log_dir in by_path
        }
        for (log_dir, tp), why in self.uncleanable().items():
            if log_dir in by_path:
                self.manager.mark_partition_uncleanable(by_path[log_dir], tp, why)
        self._abort = threading.Event()
        self.pool = LogCleaner(
            self.manager,
            sc.policy.cleaner,
            StoppableTime(sc.time, self._abort, sc.stopping),
            exit_when_idle=True,
            on_cleaned=self._cleaned,
            on_uncleanable=self._uncleanable,
        )
        sc.state.last_run_ms = now
        self.pool.start()
        sc.state.state = "cleaning"
        return waiting

    def _cleaned(self, result: CleanResult) -> None:
        self._gate_cleaned += 1
        self.sidecar.record_clean(result)

    def _uncleanable(self, managed: ManagedLog, cause: BaseException) -> None:
        why = f"{type(cause).__name__}: {cause}"
        self.sidecar.metrics.record_failure()
        self.sidecar._error(str(managed.log_dir), str(managed.topic_partition), why, dedupe=True)
        with contextlib.suppress(OSError):
            self._marks[(str(managed.log_dir), managed.topic_partition)] = (os.stat(managed.log.dir).st_ino, why)

    def uncleanable(self) -> dict[tuple[str, TopicPartition], str]:
        out = {}
        for (log_dir, tp), (inode, why) in list(self._marks.items()):
            try:
                same = os.stat(Path(log_dir) / tp.dir_name).st_ino == inode
            except OSError:
                same = False
            if same:
                out[(log_dir, tp)] = why
            else:
                self._marks.pop((log_dir, tp), None)
        return out

    def _finish_pass(self) -> None:
        sc = self.sidecar
        assert self.pool is not None
        self._dead_threads = self.pool.dead_thread_count
        self._stop_pool(timeout_s=8.0)
        assert sc.policy is not None
        self._next_attempt_ms = sc.time.milliseconds() + sc.policy.cleaner.backoff_ms
        sc.state.state = "idle"
        sc._next_scan_ms = 0  # show the result at once

    def reconfigure(self, policy: Policy, *, cleaner_changed: bool) -> None:
        if cleaner_changed and self.pool is not None:
            self.pool.reconfigure(policy.cleaner)

    def _stop_pool(self, timeout_s: float | None = None) -> None:
        """Stop the pass's threads (in-flight cleans abort at their next check and delete
        their ``.cleaned`` files) and release the locks. One deadline for all threads:
        SIGTERM must end the process within 10 s whatever ``cleaner.threads`` is."""
        with self._deaths_lock:
            pool, self.pool = self.pool, None
            if pool is not None:
                self._thread_deaths += pool.dead_thread_total
        self._abort.set()
        if pool is not None:
            for t in pool.threads:
                t.initiate_shutdown()
            deadline = None if timeout_s is None else monotonic() + timeout_s
            for t in pool.threads:
                t.join(None if deadline is None else max(deadline - monotonic(), 0.0))
        for lock in self.locks.values():
            lock.release()
        self.locks = {}

    def pause(self, now: int) -> None:
        # A paused sidecar must not keep the broker out of its log dirs.
        if self.pool is not None or self.locks:
            self._stop_pool()
            self.sidecar._next_scan_ms = 0

    def stop(self, *, leaving_mode: bool = False) -> None:
        self._stop_pool(timeout_s=8.0)

    def busy_dirs(self) -> set[Path]:
        return set(self.locks) if self.pool is not None else set()

    def held_locks(self) -> set[Path]:
        return set(self.locks)

    def fill_gauges(self, gauges: CleanerGauges) -> None:
        with self._deaths_lock:
            pool = self.pool
            gauges.thread_deaths = self._thread_deaths + (pool.dead_thread_total if pool else 0)
        gauges.dead_threads = pool.dead_thread_count if pool else self._dead_threads
        if pool is not None:
            gauges.max_buffer_utilization = pool.max_buffer_utilization()
            gauges.recopy_ratio = pool.recopy_ratio()
            gauges.max_clean_time_seconds = pool.max_clean_time_seconds()
            gauges.max_compaction_delay_seconds = pool.max_compaction_delay_seconds()

    def status_section(self) -> dict[str, Any]:
        policy = self.sidecar.policy
        windows = list(policy.compact.windows) if policy else []
        now = self.sidecar.time.milliseconds()
        return {"compact": {"windows": windows, "inWindow": bool(windows) and self._in_window(now)}}


MAX_LISTED = 50
"""Entries of each list in the ``stage`` section of ``/status`` (counts are complete)."""


class _StageController(_Controller):
    """Stages one partition per step where the broker never looks; commits only in the
    start-up gate and at SIGTERM, under ``.lock`` (``stage.commit_log_dir``)."""

    idle_state = "idle"

    def __init__(self, sidecar: Sidecar) -> None:
        super().__init__(sidecar)
        self.sets: dict[tuple[Path, TopicPartition], stage.StagedSet] = {}
        self.refused: dict[tuple[Path, TopicPartition], str] = {}
        self.commits: list[dict[str, Any]] = []
        """What the last commit (gate or termination) did, per log dir."""
        self._stop = threading.Event()
        self._cleaner: Cleaner | None = None
        self._policy_changed = threading.Event()
        """Set while a round runs when the policy file changed (``_watch_policy``): the round
        stops at once, at its next check or throttle slice, like at SIGTERM."""
        self._next_watch_ms = 0

    def gate_seconds(self) -> int:
        policy = self.sidecar.policy
        return policy.stage.max_commit_seconds if policy is not None else 0

    def gate_step(self, deadline_ns: int) -> dict[str, Any] | None:
        return self.commit(deadline_ns, "gate")

    def commit(self, deadline_ns: int, why: str) -> dict[str, Any]:
        """The fenced commit of every log dir (the broker must be stopped: the lock decides)."""
        sc = self.sidecar
        previous, sc.state.state = sc.state.state, "committing"
        reports = []
        # The policy and the cluster's topic config in force, read again right before each set.
        check = CommitCheck(sc.options.policy_path, sc.log_dirs, last_good=sc.watcher.policy)
        try:
            for d in sc.log_dirs:
                report = stage.commit_log_dir(d, sc.time, deadline_ns, wanted=check)
                reports.append(report)
                for tp, reason in report.deleted:
                    sc._error(str(d), tp, f"{why}: deleted the staged set: {reason}")
                for tp, unwanted in report.discarded:
                    sc.metrics.stage_sets_discarded.labels(unwanted.code).inc()
                    sc._error(str(d), tp, f"{why}: discarded the staged set, not committed: {unwanted.message}")
                for tp, message in report.errors:
                    sc._error(str(d), tp, f"{why}: commit failed: {message}")
                for tp in report.left:
                    sc._error(str(d), tp, f"{why}: stage.maxCommitSeconds ran out; the set stays staged", dedupe=True)
                for tp, reclaimed in report.committed:
                    sc.state.bytes_reclaimed += reclaimed
                    sc.metrics.cleanings.labels("committed").inc()
                    log.info("%s: committed the staged set of %s in %s (%d bytes reclaimed)", why, tp, d, reclaimed)
        finally:
            sc.state.state = previous
        self.sets = {k: v for k, v in self.sets.items() if stage.load(k[0] / k[1].dir_name) is not None}
        self.commits = [r.as_status() for r in reports]
        sc._next_scan_ms = 0
        return {
            "committed": sum(len(r.committed) for r in reports),
            "deleted": sum(len(r.deleted) for r in reports),
            "discarded": sum(len(r.discarded) for r in reports),
            "timedOut": sum(len(r.left) for r in reports),
            "lockHeldByBroker": [r.log_dir for r in reports if not r.locked],
        }

    def _manager(self) -> LogCleanerManager:
        sc = self.sidecar
        assert sc.policy is not None
        dirs = [LogDirectory(d, read_only=True, may_stage=True) for d in sc.log_dirs]
        return LogCleanerManager(dirs, sc.policy, sc.time, write_checkpoints=False)

    def _check_done(self, tp: TopicPartition) -> None:
        # Staging runs inside ``tick``: SIGTERM (``stopping``) must abort it, not wait for it,
        # and so must a policy change (the loop polls the file only between turns).
        if self._stop.is_set() or self.sidecar.stopping.is_set():
            raise ThreadShutdownError("the sidecar is stopping")
        self._watch_policy()
        if self._policy_changed.is_set():
            raise ThreadShutdownError("the policy changed")

    def _watch_policy(self) -> None:
        """While a round runs (between batches and segments, and in every slice of a throttle's
        sleep), look at the policy file every ``POLICY_POLL_MS`` on the clock; a change sets
        ``_policy_changed``, which ends the round as SIGTERM does."""
        sc = self.sidecar
        now = sc.time.milliseconds()
        if now >= self._next_watch_ms:
            self._next_watch_ms = now + POLICY_POLL_MS
            if sc.watcher.changed():
                self._policy_changed.set()

    def _new_cleaner(self) -> Cleaner:
        sc = self.sidecar
        assert sc.policy is not None
        cfg = sc.policy.cleaner
        return Cleaner(
            0,
            OffsetMap(cfg.dedupe_buffer_per_thread, cfg.dedupe_buffer_load_factor),
            cfg.io_buffer_per_thread // 2,
            1048588,
            Throttler(
                cfg.max_io_bytes_per_second,
                StoppableTime(sc.time, self._stop, sc.stopping, self._policy_changed, poll=self._watch_policy),
            ),
            sc.time,
            self._check_done,
        )

    def step(self, now: int) -> None:
        sc = self.sidecar
        assert sc.policy is not None
        manager = self._manager()
        logs = manager.logs()
        self.evict_for_disk()
        self.validate_all(manager, logs)
        sc.state.state = "idle"
        candidates = self._candidates(manager, logs)
        urgent = deletion_at_risk(sc.snapshot)
        best = None
        for tp, managed in candidates:
            try:
                ltc, _, _ = manager.log_to_clean(managed, stage.cleaned_to(managed.log.dir), now)
            except Exception as e:
                if isinstance(e, FileChangedError) and managed.log.moved():
                    # Deleted or moved since the listing: the next step opens it where it is now.
                    log.info("%s in %s went away during the look: %s", tp, managed.log_dir, e)
                    continue
                sc._error(str(managed.log_dir), str(tp), f"{type(e).__name__}: {e}", dedupe=True)
                continue
            min_ratio = managed.rule.min_cleanable_dirty_ratio
            remaining = urgent.get((str(managed.log_dir), tp))
            eligible = ltc.cleanable_bytes > 0 and (
                ltc.cleanable_ratio > min_ratio or ltc.needs_compaction_now or remaining is not None
            )
            # A partition about to breach its deletion deadline first (least time left first),
            # then the dirtiest.
            rank = (0, remaining, 0.0) if remaining is not None else (1, 0, -ltc.cleanable_ratio)
            if eligible and (best is None or rank < best[0]):
                best = (rank, ltc, managed)
        if best is None:
            return
        _, ltc, managed = best
        key = (managed.log_dir.path, ltc.topic_partition)
        needed = ltc.clean_bytes + ltc.cleanable_bytes
        ratio = sc.policy.stage.min_free_disk_ratio
        if not stage.free_disk_allows(managed.log_dir.path, needed, ratio):
            self.refused[key] = f"free disk would drop below stage.minFreeDiskRatio ({ratio:.0%})"
            return
        high_watermark = managed.log_dir.high_watermarks().get(ltc.topic_partition)
        if high_watermark is None:
            return
        if self._cleaner is None:
            self._cleaner = self._new_cleaner()
        sc.state.state = "staging"
        sc.state.last_run_ms = now
        self._policy_changed.clear()
        self._next_watch_ms = 0
        try:
            staged = stage.stage_partition(
                self._cleaner, managed, ltc, high_watermark=high_watermark, now_ms=now, min_free_ratio=ratio
            )
        except ThreadShutdownError:
            if self._policy_changed.is_set():  # stage_partition removed the round's work
                self._policy_changed.clear()
                log.info("staging %s aborted: the policy changed; reloading it", ltc.topic_partition)
                sc._next_policy_poll_ms = 0  # the next turn of the loop reloads it
            return  # stage_partition removed the round's work
        except stage.StageRefused as e:
            self.refused[key] = str(e)
            if isinstance(e, stage.DiskFloorReached):
                sc._error(str(managed.log_dir), str(ltc.topic_partition), str(e))
            return
        except FileChangedError as e:
            # The broker rolled, cleaned or deleted a segment the round was reading (retention,
            # its own cleaner's swap): not a failure; the round's output is gone and the next
            # pass plans from the log as it now is.
            log.info("staging %s stopped: %s; the next pass plans it again", ltc.topic_partition, e)
            sc._next_scan_ms = 0
            return
        except Exception as e:
            sc._error(str(managed.log_dir), str(ltc.topic_partition), f"staging failed: {type(e).__name__}: {e}")
            sc.metrics.record_failure()
            return
        finally:
            sc.state.state = "idle"
        if staged is not None:
            self.sets[key] = staged
            sc.metrics.cleanings.labels("staged").inc()
            sc.state.last_cleaned_at[ltc.topic_partition] = now
            sc._next_scan_ms = 0

    def _candidates(
        self, manager: LogCleanerManager, logs: dict[TopicPartition, ManagedLog]
    ) -> list[tuple[TopicPartition, ManagedLog]]:
        """The compacted partitions stage mode may work on now; the others that a guard
        refuses are recorded in ``refused`` with the reason."""
        sc = self.sidecar
        refused = refusals(logs)
        for tp in sc.duplicates:
            managed = logs.get(tp)
            if managed is not None and managed.compacted:
                refused.setdefault((managed.log_dir.path, tp), "the partition is in more than one log dir")
        self.refused = refused
        return [
            (tp, managed)
            for tp, managed in logs.items()
            if managed.compacted
            and (managed.log_dir.path, tp) not in refused
            and (managed.log_dir.path, tp) not in self.sets
        ]

    def validate_all(
        self, manager: LogCleanerManager | None = None, logs: dict[TopicPartition, ManagedLog] | None = None
    ) -> None:
        """Check every staged set (ours on disk, also after a restart) and delete stale ones,
        and the sets of partitions this policy no longer stages. Deleting is safe at any
        time: the broker never reads the stage area."""
        sc = self.sidecar
        manager = manager or self._manager()
        logs = logs if logs is not None else manager.logs()
        found: dict[tuple[Path, TopicPartition], stage.StagedSet] = {}
        for log_dir in sc.log_dirs:
            for tp, pdir in stage.staged_partitions(log_dir).items():
                key = (log_dir, tp)
                managed = logs.get(tp)
                if managed is None or not managed.compacted or managed.log_dir.path != log_dir:
                    self._delete(key, pdir, "the policy no longer stages this topic")
                    continue
                staged = stage.load(pdir)
                if staged is None:
                    continue
                reason = stage.validate(staged, pdir)
                if reason is not None:
                    self._delete(key, pdir, reason)
                    continue
                unwanted = config_unwanted(staged, managed.config) if managed.config is not None else None
                if unwanted is not None:  # the policy's or the cluster's config changed since
                    sc.metrics.stage_sets_discarded.labels(unwanted.code).inc()
                    self._delete(key, pdir, unwanted.message)
                    continue
                found[key] = staged
        self.sets = found

    def evict_for_disk(self) -> None:
        sc = self.sidecar
        assert sc.policy is not None
        ratio = sc.policy.stage.min_free_disk_ratio
        for d in sc.log_dirs:
            for tp, size in stage.evict_for_disk(d, ratio):
                sc._error(str(d), tp, f"deleted the staged set ({size} bytes): free disk is below {ratio:.0%}")

    def _delete(self, key: tuple[Path, TopicPartition], pdir: Path, reason: str) -> None:
        if stage.load(pdir) is not None:
            self.sidecar._error(str(key[0]), str(key[1]), f"deleted the staged set: {reason}")
        stage.delete_set(pdir)
        self.sets.pop(key, None)

    def pause(self, now: int) -> None:
        # Paused means no new staging; staged sets are still validated (and the disk
        # guarded) on every turn.
        self.evict_for_disk()
        self.validate_all()

    def reconfigure(self, policy: Policy, *, cleaner_changed: bool) -> None:
        if cleaner_changed:
            self._cleaner = None  # the next round builds one with the new settings

    def stop(self, *, leaving_mode: bool = False) -> None:
        """Leaving stage mode deletes every set (no other mode validates them). Shutting
        down (SIGTERM) commits them if the broker has exited: native sidecars stop after
        the pod's main containers. A broker still running holds ``.lock``, and nothing is
        done (the sidecar alone is restarting)."""
        self._stop.set()
        sc = self.sidecar
        try:
            if leaving_mode:
                why = "the policy file is gone" if sc._policy_gone else "the policy left stage mode"
                for d in sc.log_dirs:
                    for tp, pdir in stage.staged_partitions(d).items():
                        self._delete((d, tp), pdir, why)
            elif sc._policy_gone:
                pass  # a deleted policy's sets are gone, and nothing is committed
            elif sc.policy is not None and sc.log_dirs and sc.gate.open:
                # Paused or not: the commit obeys the policy file as it is now (a paused
                # policy's sets are discarded, never committed).
                deadline = sc.time.nanoseconds() + self.gate_seconds() * 1_000_000_000
                self.commit(deadline, "termination")
        except (KafkaCleanerError, OSError) as e:
            log.warning("stage mode's last step failed: %s", e)

    def fill_gauges(self, gauges: CleanerGauges) -> None:
        policy = self.sidecar.policy
        if policy is not None:
            gauges.stage_min_free_disk_ratio = policy.stage.min_free_disk_ratio

    def staged_bytes(self) -> dict[TopicPartition, int]:
        return {key[1]: s.staged_bytes for key, s in self.sets.items()}

    def status_section(self) -> dict[str, Any]:
        sets = sorted(self.sets.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))
        refused = sorted(self.refused.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))
        return {
            "stage": {
                "sets": len(sets),
                "stagedSets": [
                    {
                        "topic": tp.topic,
                        "partition": tp.partition,
                        "logDir": str(d),
                        "baseOffset": s.base_offset,
                        "nextOffset": s.next_offset,
                        "stagedBytes": s.staged_bytes,
                        "sourceBytes": s.source_bytes,
                        "stagedAt": rfc3339(s.created_at_ms),
                    }
                    for (d, tp), s in sets[:MAX_LISTED]
                ],
                "refusedPartitions": len(refused),
                "refused": [
                    {"topic": tp.topic, "partition": tp.partition, "logDir": str(d), "reason": why[:1024]}
                    for (d, tp), why in refused[:MAX_LISTED]
                ],
                "lastCommit": self.commits,
            }
        }
