"""The cleaner's I/O throttle, shared by every cleaner thread (Kafka's ``Throttler`` with
``log.cleaner.io.max.bytes.per.second``).

Every read chunk and every written chunk is reported; once more than the check interval
(300 ms) has passed, a rate above the desired one makes the caller sleep just long enough
to bring the period back to the desired rate. Time comes from the injectable clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cleaner.clock import Time

CHECK_INTERVAL_MS = 300


class Throttler:
    def __init__(
        self,
        desired_bytes_per_second: float | None,
        time: Time,
        check_interval_ms: int = CHECK_INTERVAL_MS,
        meter: Callable[[int], None] | None = None,
    ) -> None:
        self.desired_rate = desired_bytes_per_second
        self.meter = meter
        """Sees every byte read and written (Kafka's ``cleaner-io`` meter): progress bars
        and metrics hang here."""
        self.time = time
        self.check_interval_ns = check_interval_ms * 1_000_000
        self._lock = threading.Lock()
        self._period_start_ns = time.nanoseconds()
        self._observed = 0.0
        self.total_bytes = 0
        self.total_sleep_ms = 0

    def maybe_throttle(self, observed: int) -> None:
        if self.meter is not None:
            self.meter(observed)
        with self._lock:
            self.total_bytes += observed
            if self.desired_rate is None:
                return
            self._observed += observed
            now = self.time.nanoseconds()
            elapsed_ns = now - self._period_start_ns
            if elapsed_ns > self.check_interval_ns and self._observed > 0:
                rate = self._observed * 1e9 / elapsed_ns
                if rate > self.desired_rate:
                    elapsed_ms = elapsed_ns // 1_000_000
                    sleep_ms = round(self._observed / (self.desired_rate / 1000.0) - elapsed_ms)
                    if sleep_ms > 0:
                        self.total_sleep_ms += sleep_ms
                        self.time.sleep(sleep_ms)
                self._period_start_ns = self.time.nanoseconds()
                self._observed = 0.0
