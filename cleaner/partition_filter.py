"""``--topic REGEX`` and ``--partition N``: which partitions a command looks at.

The same options on ``status``, ``clean``, ``run`` and ``dump``. A topic matches when the
whole name matches the regular expression (``re.fullmatch``), as a policy rule's ``match``
does: ``orders-.*``, not the glob ``orders-*`` (which is ``orders`` followed by dashes).
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
    return click.option(
        "--topic",
        default=None,
        metavar="REGEX",
        help="Only topics whose whole name matches this regular expression (matched in full, "
        "like a policy's match: 'orders-.*', not the glob 'orders-*').",
    )(f)


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


def unmatched(what: str, regex: str, topics: Sequence[str]) -> str | None:
    """A warning when ``regex`` matches the whole name of none of ``topics`` (with the
    regular expression a glob was probably meant as); None when it matches one."""
    if any(re.fullmatch(regex, t) for t in topics):
        return None
    warning = (
        f"{what} '{regex}' matches no topic here ({len(topics)} seen): it is a regular expression, "
        "matched against the whole topic name"
    )
    meant = glob_meant(regex, topics)
    return warning + (f"; '{meant}' would match (as the glob '{regex}' does)" if meant else "")


def glob_meant(regex: str, topics: Sequence[str]) -> str | None:
    """The regular expression for ``regex`` read as a shell glob (``orders-*`` ->
    ``orders-.*``), when it differs and matches one of ``topics`` and ``regex`` does not."""
    if "*" not in regex and "?" not in regex:
        return None
    as_regex = "".join({"*": ".*", "?": "."}.get(c, "\\" + c if c in ".^$+{}[]()|\\" else c) for c in regex)
    if as_regex == regex or any(re.fullmatch(regex, t) for t in topics):
        return None
    return as_regex if any(re.fullmatch(as_regex, t) for t in topics) else None
