"""``GET /where``: ``kafka-cleaner where`` for the sidecar's own broker, over HTTP.

A key's records are on every replica's disk, and a person asking "where is this key still,
and when will it be gone?" wants one answer for the whole cluster. The operator's ``where``
(``kafka-cleaner-operator where``) asks every broker's sidecar this question and puts the
answers together; each sidecar answers for its log dirs with the same code as the CLI
(``cleaner.where``), read-only and lock-free.

The query: ``topic`` (exact name), ``key-hex`` (the key's bytes in hexadecimal), and
optionally ``partition`` or ``partitions`` as in the CLI. The answer is JSON: the sightings
(the CLI's ``--output json`` rows) and the notes. One question at a time per sidecar: a
second one while a first reads is told 429, so a loop of questions cannot become a read
storm beside the broker. The topic's configs are the policy's rule for it where it has one,
else the CLI's default (compacted, Kafka's defaults); the cluster's own topic configs win
where the metadata log is on the disk, as in the CLI.
"""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict
from http import HTTPStatus
from pathlib import Path
from typing import Any

import click

from cleaner.config import Policy, parse_policy_text
from cleaner.errors import KafkaCleanerError
from cleaner.where import DEFAULT_POLICY, where

__all__ = ["MAX_KEY_BYTES", "WhereEndpoint"]

MAX_KEY_BYTES = 16 * 1024
"""The longest key asked for: its hex is in the request line, which the HTTP server reads up to
64 KiB. Kafka's keys are seldom more than a few hundred bytes."""

_PARAMETERS = frozenset({"topic", "key-hex", "partition", "partitions"})


class BadQuery(ValueError):
    """A query this endpoint cannot answer; the message says which parameter and why."""


def parse_query(query: str) -> dict[str, Any]:
    """``topic``, ``key`` (bytes), ``partition`` and ``partitions`` of a ``/where`` query."""
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(params) - _PARAMETERS)
    if unknown:
        raise BadQuery(f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(_PARAMETERS))}")
    for name, values in params.items():
        if len(values) > 1:
            raise BadQuery(f"{name} given {len(values)} times")
    one = {name: values[0] for name, values in params.items()}
    if not one.get("topic"):
        raise BadQuery("topic is required (the topic's exact name)")
    if "key-hex" not in one:
        raise BadQuery("key-hex is required (the key's bytes in hexadecimal)")
    try:
        key = bytes.fromhex(re.sub(r"\s+", "", one["key-hex"]))
    except ValueError as e:
        raise BadQuery(f"key-hex is not hexadecimal: {e}") from None
    if len(key) > MAX_KEY_BYTES:
        raise BadQuery(f"the key is {len(key):,} bytes; at most {MAX_KEY_BYTES:,} are asked for here")
    out: dict[str, Any] = {"topic": one["topic"], "key": key, "partition": None, "partitions": None}
    for name, least in (("partition", 0), ("partitions", 1)):
        if name in one:
            try:
                out[name] = int(one[name])
            except ValueError:
                raise BadQuery(f"{name} is not a whole number: {one[name]!r}") from None
            if out[name] < least:
                raise BadQuery(f"{name} is {out[name]}; at least {least}")
    return out


class WhereEndpoint:
    """Answers ``/where`` queries, one at a time."""

    def __init__(self) -> None:
        self._reading = threading.Lock()

    def answer(self, query: str, log_dirs: Sequence[Path], policy: Policy | None,
               now_ms: int) -> tuple[HTTPStatus, dict[str, Any]]:
        """The HTTP status and JSON document for ``query`` on ``log_dirs``."""
        try:
            asked = parse_query(query)
        except BadQuery as e:
            return HTTPStatus.BAD_REQUEST, {"error": str(e)}
        if policy is None or not log_dirs:
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the sidecar has no policy or no log dir yet"}
        if policy.rule_for(asked["topic"]) is None:
            policy = parse_policy_text(DEFAULT_POLICY)
        if not self._reading.acquire(blocking=False):
            return HTTPStatus.TOO_MANY_REQUESTS, {"error": "another where is reading this broker's disk; ask again "
                                                           "once it has answered"}
        try:
            sightings, notes = where(log_dirs, policy, asked["key"], asked["topic"], now_ms,
                                     partition=asked["partition"], partitions=asked["partitions"])
        except click.UsageError as e:
            return HTTPStatus.BAD_REQUEST, {"error": e.message}
        except (KafkaCleanerError, OSError) as e:
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(e)}
        finally:
            self._reading.release()
        return HTTPStatus.OK, {"version": 1, "topic": asked["topic"], "notes": notes,
                               "sightings": [asdict(s) for s in sightings]}
