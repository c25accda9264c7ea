"""Leader election through a ``coordination.k8s.io/v1`` Lease, for more than one replica.

kopf's own peering is not leader election: replicas of equal priority all pause. So the
operator elects a leader the way client-go does: a Lease names its holder and when it last
renewed; a candidate takes the Lease once the holder has not renewed for
``leaseDurationSeconds``; the leader renews every retry period and steps down (the process
exits, to be restarted as a candidate) when it could not renew for ``renew_deadline``. Writes
carry the Lease's resourceVersion, so two candidates never both win.

Only the leader runs kopf (reconciles, reports, serves the webhook); the others wait, and
their /readyz says not ready, so the webhook Service only sends to the leader.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

from compaction_operator.kube import Kube
from kubernetes.client.exceptions import ApiException

from cleaner.clock import SystemTime, Time

__all__ = ["LeaseElector"]

log = logging.getLogger("kafka-cleaner-operator.leader")


def _micro_time(ms: int) -> str:
    """A Lease's MicroTime. Never on a whole second: the kubernetes client (37.x) parses the
    body into its model and writes the time back with ``isoformat()``, which leaves out a zero
    fraction, and the API server refuses a MicroTime without its six digits (400; shown on
    the real control plane). One microsecond later is the same moment for a lease."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    if moment.microsecond == 0:
        moment += datetime.timedelta(microseconds=1)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """One candidate for the Lease ``namespace/name``."""

    def __init__(self, kube: Kube, *, namespace: str, name: str, identity: str, lease_duration: float = 15.0,
                 renew_deadline: float = 10.0, retry_period: float = 2.0, time: Time | None = None) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.time = time or SystemTime()
        self._observed: tuple[str | None, str | None, int] = (None, None, 0)  # holder, renewTime, seen at (ms)

    # -- one attempt ------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True if this candidate holds the Lease afterwards."""
        now = self.time.milliseconds()
        try:
            lease = self.kube.read_lease(self.namespace, self.name)
            if lease is None:
                self.kube.create_lease(self.namespace, self._lease({}, now, transitions=0, acquired=True))
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            if holder != self.identity and holder and not self._expired(holder, spec, now):
                return False
            acquired = holder != self.identity
            transitions = int(spec.get("leaseTransitions") or 0) + (1 if acquired and holder else 0)
            self.kube.replace_lease(self.namespace, self.name, self._lease(lease, now, transitions=transitions,
                                                                            acquired=acquired))
            if acquired:
                log.info("Acquired the lease %s/%s (previous holder: %s).", self.namespace, self.name,
                         holder or "none")
            return True
        except ApiException as exc:
            if exc.status in (409, 422):  # someone else wrote first
                return False
            raise

    def _expired(self, holder: str, spec: dict[str, Any], now: int) -> bool:
        """Whether the holder let the Lease lapse. Judged by when *this* candidate saw the
        renewTime change (client-go's rule), so clock skew between nodes does not matter."""
        renew = spec.get("renewTime")
        if self._observed[:2] != (holder, renew):
            self._observed = (holder, renew, now)
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        return now - self._observed[2] > duration * 1000

    def _lease(self, current: dict[str, Any], now: int, *, transitions: int, acquired: bool) -> dict[str, Any]:
        spec = dict(current.get("spec") or {})
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=int(self.lease_duration),
                    renewTime=_micro_time(now), leaseTransitions=transitions)
        if acquired or not spec.get("acquireTime"):
            spec["acquireTime"] = _micro_time(now)
        metadata = dict(current.get("metadata") or {"name": self.name, "namespace": self.namespace})
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def release(self) -> None:
        """Give the Lease up at shutdown, so the next leader need not wait for it to lapse."""
        try:
            lease = self.kube.read_lease(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = dict(lease["spec"])
            spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=_micro_time(self.time.milliseconds()))
            self.kube.replace_lease(self.namespace, self.name, {**lease, "spec": spec})
        except ApiException as exc:
            log.warning("Could not release the lease %s/%s: %s", self.namespace, self.name, exc.reason)

    # -- the loops -------------------------------------------------------------------------

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this candidate leads (True) or ``stop`` is set (False)."""
        log.info("Waiting to lead through the lease %s/%s as %s.", self.namespace, self.name, self.identity)
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    return True
            except Exception as exc:  # the API server may be briefly unreachable; keep trying
                log.warning("Leader election attempt failed: %s", exc)
            self.time.wait(stop, self.retry_period * 1000)
        return False

    def keep_leading(self, stop: threading.Event, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in a daemon thread until ``stop``; call ``on_lost`` once, when another replica
        took the Lease or when it has not been renewed for ``renew_deadline``.

        The deadline is kept by a watchdog thread of its own: a renewal hanging on an
        unreachable API server must not keep this replica acting past the moment another may
        take the Lease (``lease_duration`` after the last renewal it saw). ``renew_deadline``
        is shorter than that, so the leader is fenced before anyone else can lead.
        """
        renewed_at = [self.time.milliseconds()]  # the caller has just acquired or renewed
        lost = threading.Event()
        lost_guard = threading.Lock()

        def lose() -> None:
            with lost_guard:
                if lost.is_set():
                    return
                lost.set()
            on_lost()

        def renew() -> None:
            while not self.time.wait(stop, self.retry_period * 1000) and not lost.is_set():
                try:
                    if self.try_acquire_or_renew():
                        renewed_at[0] = self.time.milliseconds()
                        continue
                    log.error("Another replica took the lease %s/%s.", self.namespace, self.name)
                    lose()
                    return
                except Exception as exc:  # the watchdog decides when failures have lasted too long
                    log.warning("Could not renew the lease: %s", exc)

        def watchdog() -> None:
            while not stop.is_set() and not lost.is_set():
                left = renewed_at[0] + self.renew_deadline * 1000 - self.time.milliseconds()
                if left <= 0:
                    log.error("The lease %s/%s was not renewed for %s s.", self.namespace, self.name,
                              self.renew_deadline)
                    lose()
                    return
                self.time.wait(stop, left)

        for target, name in ((watchdog, "lease-deadline"), (renew, "lease-renewal")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
        return thread
