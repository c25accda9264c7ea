"""``kafka-cleaner-operator where``'s reading of one broker's answer (``ask_direct``) against a
small HTTP server playing sidecars that answer wrongly: an older sidecar without ``/where``, a
refusal, a document that is not an answer, an answer too large. Each is that broker's "no
answer" with the reason, never an exception that would lose the other brokers' answers."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from compaction_operator import where
from compaction_operator.status import BrokerPod

SIGHTING = {"log_dir": "/d", "topic": "t", "partition": 0, "file": "/d/t-0/0.log", "offset": 5,
            "timestamp_ms": 1, "kind": "value", "latest": True, "place": "segment", "gone": "never", "gone_by_ms": None}


@pytest.fixture
def sidecar() -> Iterator[tuple[int, dict[str, tuple[int, bytes]]]]:
    answers: dict[str, tuple[int, bytes]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers[self.path.split("?")[0]]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], answers
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("status", "body", "says"), [
    (404, b"not found\n", "its sidecar has no /where (older than this command)"),
    (429, json.dumps({"error": "another where is reading"}).encode(), "HTTP 429: another where is reading"),
    (200, b"[1, 2]", "not a where answer"),
    (200, json.dumps({"sightings": [{"nonsense": 1}], "notes": []}).encode(), "not a where answer"),
    (500, b"<html>", "not a where answer"),
])  # fmt: skip
def test_a_wrong_answer_is_that_brokers_no_answer(sidecar, status: int, body: bytes, says: str) -> None:
    port, answers = sidecar
    answers["/where"] = (status, body)
    answer = where.ask_direct(BrokerPod("kafka-1", ip="127.0.0.1", port=port), 9410, "topic=t&key-hex=6b", 5)
    assert answer.error is not None and says in answer.error and answer.sightings == []


def test_an_answer_is_read_and_a_too_large_one_is_refused(sidecar, monkeypatch: pytest.MonkeyPatch) -> None:
    port, answers = sidecar
    answers["/where"] = (200, json.dumps({"version": 1, "sightings": [SIGHTING], "notes": ["n"]}).encode())
    pod = BrokerPod("kafka-1", ip="127.0.0.1", port=port)
    answer = where.ask_direct(pod, 9410, "topic=t&key-hex=6b", 5)
    assert answer.error is None and answer.notes == ["n"] and answer.sightings[0].offset == 5
    monkeypatch.setattr(where, "MAX_ANSWER", 100)
    assert "an answer of more than" in (where.ask_direct(pod, 9410, "topic=t&key-hex=6b", 5).error or "")
    no_ip = where.ask_direct(BrokerPod("kafka-2", ip=None), 9410, "topic=t&key-hex=6b", 5)
    assert no_ip.error == "the pod has no IP address yet"
