"""Time, injectable (Kafka's ``Time`` / ``MockTime``).

Nothing in the engine reads the wall clock directly: delete horizons, compaction lags,
producer expiry, backoff and throttling all ask a ``Time``. Tests use ``MockTime`` and
move it forward explicitly, so no test waits for a real timeout.
"""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Callable
from typing import Protocol

from cleaner.errors import ThreadShutdownError


class Time(Protocol):
    def milliseconds(self) -> int:
        """Wall-clock time in epoch milliseconds (what Kafka stores in timestamps)."""

    def nanoseconds(self) -> int:
        """A monotonic clock for measuring durations."""

    def sleep(self, ms: float) -> None:
        """Pause the calling thread."""

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        """Wait until ``event`` is set or ``timeout_ms`` passed; True if the event is set."""


class SystemTime:
    """The real clock."""

    def milliseconds(self) -> int:
        return _time.time_ns() // 1_000_000

    def nanoseconds(self) -> int:
        return _time.monotonic_ns()

    def sleep(self, ms: float) -> None:
        if ms > 0:
            _time.sleep(ms / 1000.0)

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        return event.wait(max(timeout_ms, 0) / 1000.0)


class MockTime:
    """A clock that only moves when told to.

    ``sleep`` advances the clock at once (as Kafka's MockTime does). ``wait`` blocks until
    the event is set or another thread ``advance``s the clock past the deadline, so a
    thread backing off under a MockTime wakes exactly when the test moves time.
    """

    def __init__(self, ms: int = 1_700_000_000_000, nanos: int = 0) -> None:
        self._ms = ms
        self._nanos = nanos
        self._changed = threading.Condition()

    def milliseconds(self) -> int:
        return self._ms

    def nanoseconds(self) -> int:
        return self._nanos

    def advance(self, ms: float) -> None:
        with self._changed:
            self._ms += int(ms)
            self._nanos += int(ms * 1_000_000)
            self._changed.notify_all()

    def set(self, ms: int) -> None:
        with self._changed:
            self._nanos += max(ms - self._ms, 0) * 1_000_000
            self._ms = ms
            self._changed.notify_all()

    def sleep(self, ms: float) -> None:
        if ms > 0:
            self.advance(ms)

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        deadline = self._ms + timeout_ms
        with self._changed:
            while not event.is_set() and self._ms < deadline:
                # Wake up now and then to notice the event (Event has no condition to share).
                self._changed.wait(0.01)
        return event.is_set()


class FixedTime(SystemTime):
    """A wall clock stopped at ``ms`` (``--now-ms``): delete horizons, lags and producer
    expiry see one instant, while waits and durations stay real."""

    def __init__(self, ms: int) -> None:
        self._ms = ms

    def milliseconds(self) -> int:
        return self._ms


SYSTEM_TIME = SystemTime()


class StoppableTime:
    """The clock given to throttled work (cleaner threads, staging, scans): once one of
    ``events`` is set, a throttle's sleep raises ``ThreadShutdownError`` (within 100 ms),
    which aborts the round like the cleaner's own shutdown check, so SIGTERM, SIGINT, a
    pause or a mode switch never waits for it (``Throttler`` sleeps in one piece, up to seconds at a
    low ``maxIoBytesPerSecond``), and the work does not go on unthrottled either.
    ``poll``, when given, runs before each slice in the sleeping thread and may set one of the
    events (stage mode's policy watch: a changed policy file aborts a throttled round).
    Everything else is the wrapped clock."""

    SLICE_MS = 100

    def __init__(self, time: Time, *events: threading.Event, poll: Callable[[], None] | None = None) -> None:
        self._time = time
        self._events = events
        self._poll = poll

    def milliseconds(self) -> int:
        return self._time.milliseconds()

    def nanoseconds(self) -> int:
        return self._time.nanoseconds()

    def sleep(self, ms: float) -> None:
        while True:
            if self._poll is not None:
                self._poll()
            if any(e.is_set() for e in self._events):
                raise ThreadShutdownError("stopping this work")
            if ms <= 0:
                return
            step = min(ms, self.SLICE_MS)
            self._time.sleep(step)
            ms -= step

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        return self._time.wait(event, timeout_ms)
