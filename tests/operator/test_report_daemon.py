"""The report daemon's wait between rounds (``handlers._until_next_round``): the next round
comes ``reporting.intervalSeconds`` after the last, at once when the policy's spec changes
(kopf keeps a daemon's body current), and the wait ends as soon as the daemon is asked to stop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from compaction_operator.handlers import DAEMON_POLL_S, _until_next_round

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
