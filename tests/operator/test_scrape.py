"""Where the operator pulls a sidecar's /status from (compaction_operator.scrape)."""

from __future__ import annotations

from typing import Any

import pytest
from compaction_operator.scrape import pod_address, status_url


@pytest.mark.parametrize(("status", "address"), [
    ({"podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}]}, "10.0.0.7"),
    ({"podIP": "10.0.0.7"}, "10.0.0.7"),
    # Dual stack, IPv6 first: the sidecar listens on 0.0.0.0, so its IPv4 address answers.
    ({"podIP": "fd00::7", "podIPs": [{"ip": "fd00::7"}, {"ip": "10.0.0.7"}]}, "10.0.0.7"),
    # IPv6 only: the only address there is (the sidecar cannot answer on it yet).
    ({"podIP": "fd00::7", "podIPs": [{"ip": "fd00::7"}]}, "fd00::7"),
    ({"podIP": "", "podIPs": []}, None),
    ({}, None),
    ({"podIP": "not-an-ip", "podIPs": [{"ip": "also-not"}]}, "not-an-ip"),  # reported by the scrape
])
def test_the_pods_ipv4_address_is_preferred(status: dict[str, Any], address: str | None) -> None:
    assert pod_address(status) == address


def test_status_urls() -> None:
    assert status_url("10.0.0.7", 9410) == "http://10.0.0.7:9410/status"
    assert status_url("fd00::7", 9410) == "http://[fd00::7]:9410/status"


def test_reports_are_validated_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop that pulls the reports also answers the API server's webhook calls: the
    jsonschema validation of 50 reports of 200 partitions runs in worker threads, and the
    loop stays free meanwhile (a timer on it keeps firing)."""
    import asyncio
    import json
    import threading
    import time

    import aiohttp
    from aiohttp import web
    from compaction_operator import scrape
    from compaction_operator.status import BrokerPod
    from operator_samples import make_report

    body = json.dumps(make_report("kafka-0", partitions=200)).encode()
    threads: set[int] = set()
    real = scrape.parse_report

    def parse(raw: bytes, pod: str) -> Any:
        threads.add(threading.get_ident())
        # A validation that takes a while (a big report on a busy node): on the loop it would
        # stop the ticker for 50 x 20 ms; in workers the loop turns thousands of times meanwhile.
        time.sleep(0.02)
        return real(raw, pod)

    monkeypatch.setattr(scrape, "parse_report", parse)

    async def main() -> tuple[dict[str, Any], int, int]:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type="application/json")

        app = web.Application()
        app.router.add_get("/status", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        try:
            async with aiohttp.ClientSession() as session:
                pods = [BrokerPod(f"kafka-{i}", ip="127.0.0.1") for i in range(50)]
                results = await scrape.fetch_reports(session, pods, port, 30.0)
        finally:
            task.cancel()
            await runner.cleanup()
        return results, threading.get_ident(), ticks

    results, loop_thread, ticks = asyncio.run(main())
    assert all(r.error is None for r in results.values()), [r.error for r in results.values() if r.error][:3]
    assert len(results) == 50 and threads and loop_thread not in threads
    assert ticks > 500, f"the loop turned only {ticks} times during 1 s of validation"
