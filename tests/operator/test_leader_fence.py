"""A leader whose renewal hangs is fenced by the renew deadline, not by the hung call.

Another replica may take the Lease ``lease_duration`` after the last renewal it saw. If the
leader learnt it had lost only when its renewal returned, an API server that accepts the
connection and never answers would keep it acting for as long as the call hangs. The
renewal here goes to a real socket that accepts and never answers; the clock is a MockTime.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import kubernetes
import pytest
from compaction_operator.kube import Kube
from compaction_operator.leader import LeaseElector

from cleaner.clock import MockTime


@pytest.fixture
def silent_api_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A listening socket that accepts connections and never answers them."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    server.close()
    for conn in accepted:
        conn.close()


def wait_until(condition: threading.Event, what: str, seconds: float = 30) -> None:
    assert condition.wait(seconds), f"timed out waiting for {what}"


def test_a_hung_renewal_is_fenced_at_the_renew_deadline(silent_api_server: tuple[str, list[socket.socket]]) -> None:
    host, accepted = silent_api_server
    configuration = kubernetes.client.Configuration()
    configuration.host = host
    time_ = MockTime()
    elector = LeaseElector(Kube(kubernetes.client.ApiClient(configuration)), namespace="ns", name="lease",
                           identity="a", lease_duration=15, renew_deadline=10, retry_period=2, time=time_)
    stop, lost = threading.Event(), threading.Event()
    renewal = elector.keep_leading(stop, lost.set)
    try:
        time_.advance(2_000)  # the first renewal starts, and hangs on the silent server
        for _ in range(3000):
            if accepted:
                break
            lost.wait(0.01)
        assert accepted, "the renewal never reached the API server"
        assert not lost.is_set()  # 2 s since the last renewal: still leading
        time_.advance(8_000)  # 10 s: the renew deadline, with the renewal still hanging
        wait_until(lost, "on_lost at the renew deadline")
        assert renewal.is_alive()  # fenced while the call still hangs: the watchdog did it
    finally:
        stop.set()
        time_.advance(60_000)
