"""``--topic REGEX`` and ``--partition N``: which partitions a command looks at.

The same options on ``status``, ``clean``, ``run`` and ``dump``. A topic matches when the
whole name matches the regex, as a policy rule's ``match`` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import click

from cleaner.storage.topic_partition import TopicPartition

PartitionFilter = Callable[[TopicPartition], bool]


def filter_options(f: Callable) -> Callable:
    """Adds ``--topic`` and ``--partition`` (the parameters ``topic`` and ``partitions``)."""
    f = click.option(
        "--partition",
        "partitions",
        type=click.IntRange(min=0),
        multiple=True,
        help="Only this partition number (repeatable).",
    )(f)
    return click.option("--topic", default=None, help="Only topics whose whole name matches this regex.")(f)


def partition_filter(topic: str | None, partitions: Sequence[int]) -> PartitionFilter | None:
    """The filter the options ask for; None when they ask for every partition."""
    if topic is None and not partitions:
        return None
    try:
        pattern = re.compile(topic) if topic is not None else None
    except re.error as e:
        raise click.BadParameter(f"not a regular expression: {e}", param_hint="--topic") from e
    wanted = set(partitions)

    def only(tp: TopicPartition) -> bool:
        return (pattern is None or pattern.fullmatch(tp.topic) is not None) and (not wanted or tp.partition in wanted)

    return only
