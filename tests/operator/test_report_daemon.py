"""The report daemon's wait between rounds (``handlers._until_next_round``): the next round
comes ``reporting.intervalSeconds`` after the last, at once when the policy's spec changes
(kopf keeps a daemon's body current), and the wait ends as soon as the daemon is asked to stop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from compaction_operator.handlers import DAEMON_POLL_S, Operator, _until_next_round
from compaction_operator.settings import OperatorConfig

DEADLINE_S = 30.0
"""How long a wait that must end is given before the test fails naming it."""


class Stopped:
    """kopf's ``DaemonStopped`` as the daemon reads it: true once the daemon is asked to stop."""

    def __init__(self) -> None:
        self.flag = False

    def __bool__(self) -> bool:
        return self.flag


def _body(interval: float) -> dict[str, Any]:
    return {"metadata": {"generation": 1}, "spec": {"reporting": {"intervalSeconds": interval}}}


async def _ends_after(change: Any, body: dict[str, Any], stopped: Stopped) -> None:
    """Starts the wait, makes ``change`` once it has polled, and fails unless the wait then ends."""
    waiting = asyncio.create_task(_until_next_round(stopped, body))
    await asyncio.sleep(DAEMON_POLL_S * 2)
    assert not waiting.done(), "the wait ended before anything changed"
    change()
    await asyncio.wait_for(waiting, DEADLINE_S)


def test_a_spec_change_starts_the_next_round_at_once() -> None:
    body = _body(3600)

    def edit() -> None:  # a person lowers the interval: the API server bumps the generation
        body["spec"]["reporting"]["intervalSeconds"] = 1
        body["metadata"]["generation"] = 2

    asyncio.run(_ends_after(edit, body, Stopped()))


def test_the_wait_ends_when_the_daemon_is_asked_to_stop() -> None:
    stopped = Stopped()
    asyncio.run(_ends_after(lambda: setattr(stopped, "flag", True), _body(3600), stopped))


def test_without_a_change_the_wait_lasts_the_interval() -> None:
    async def wait() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_until_next_round(Stopped(), _body(3600)), DAEMON_POLL_S * 3)
        await asyncio.wait_for(_until_next_round(Stopped(), _body(0.01)), DEADLINE_S)

    asyncio.run(wait())


def _policy_body() -> dict[str, Any]:
    return {"metadata": {"namespace": "kafka", "name": "p", "uid": "u-1", "generation": 1}, "spec": {}}


def test_a_round_after_the_operator_stopped_does_nothing() -> None:
    """kopf may start a daemon again after its daemon killer ran, from a watch event still being
    handled while the operator stops (a fresh-clone run: the respawned daemon's rounds failed
    with "Session is closed" and a traceback each second until kopf cancelled it 5 s later).
    A round after ``stop`` returns at once, touching neither the API nor the sidecars."""
    op = Operator(OperatorConfig(http_port=0))
    asyncio.run(op.stop())
    asyncio.run(asyncio.wait_for(op.round(_policy_body(), scrape=True, logger=logging.getLogger("test")), DEADLINE_S))
    assert op.kube is None and op.session is None


def test_stop_closes_the_session_only_after_the_round_in_progress() -> None:
    """A round holds its policy's lock from its start to its end: ``stop`` waits for it before
    it closes the HTTP session the round scrapes the sidecars with."""

    async def scenario() -> None:
        op = Operator(OperatorConfig(http_port=0))
        op.session = aiohttp.ClientSession()
        state = op.state(_policy_body())
        await state.lock.acquire()  # a round in progress
        stopping = asyncio.create_task(op.stop())
        await asyncio.sleep(DAEMON_POLL_S * 2)
        assert not stopping.done() and not op.session.closed, "the session closed under a running round"
        state.lock.release()
        await asyncio.wait_for(stopping, DEADLINE_S)
        assert op.session.closed

    asyncio.run(scenario())
