"""Maintenance time windows: cron expressions in Quartz's syntax, as Strimzi's
``maintenanceTimeWindows``. An instant is inside a window when the expression is satisfied
by it (Quartz's ``CronExpression.isSatisfiedBy``), evaluated in UTC: Strimzi's
``* * 0-1 ? * SUN,MON,TUE,WED,THU,FRI,SAT`` is every day from 00:00:00 to 01:59:59.

Fields: seconds, minutes, hours, day of month, month (1-12 or JAN-DEC), day of week (1-7
= SUN-SAT, or SUN-SAT) and an optional year. Each field is ``*``, a value, a range ``a-b``,
a step ``*/n``, ``a/n`` or ``a-b/n``, or a comma-separated list of those. As in Quartz,
exactly one of day of month and day of week is ``?`` (no specific value). Quartz's ``L``,
``W`` and ``#`` are not supported and rejected with a clear error.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass

#: What a window expression looks like to the CRD (the API server cannot parse cron): 6 or
#: 7 space-separated fields of Quartz's characters. ``parse_cron`` checks the rest.
CRON_PATTERN = r"^[-*?/,0-9A-Za-z]+( +[-*?/,0-9A-Za-z]+){5,6}$"

_MONTHS = {
    m: i + 1 for i, m in enumerate(["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"])
}
_DAYS = {d: i + 1 for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}
_FIELDS = (
    ("seconds", 0, 59, {}),
    ("minutes", 0, 59, {}),
    ("hours", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 1, 7, _DAYS),
    ("year", 1970, 2099, {}),
)


class CronError(ValueError):
    """An expression that is not a supported Quartz cron expression."""


@dataclass(frozen=True)
class CronExpression:
    text: str
    fields: tuple[frozenset[int] | None, ...]
    """One set of allowed values per field (seconds .. year); None: any (``*`` or ``?``)."""

    def matches(self, epoch_ms: int) -> bool:
        t = datetime.datetime.fromtimestamp(epoch_ms / 1000.0, tz=datetime.UTC)
        quartz_weekday = (t.weekday() + 1) % 7 + 1  # Monday=0 in Python; SUN=1 in Quartz
        values = (t.second, t.minute, t.hour, t.day, t.month, quartz_weekday, t.year)
        return all(allowed is None or v in allowed for allowed, v in zip(self.fields, values, strict=False))


def _value(token: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    if token.upper() in names:
        return names[token.upper()]
    if not token.isdigit():
        if set(token.upper()) & set("LW#"):
            raise CronError(f"{name}: {token!r}: Quartz's L, W and # are not supported")
        raise CronError(f"{name}: {token!r} is not a number" + (f" or one of {', '.join(names)}" if names else ""))
    value = int(token)
    if not low <= value <= high:
        raise CronError(f"{name}: {value} is outside {low}-{high}")
    return value


def _field(text: str, name: str, low: int, high: int, names: dict[str, int]) -> frozenset[int] | None:
    if text in ("*", "?"):
        return None
    out: set[int] = set()
    for item in text.split(","):
        head, slash, step_text = item.partition("/")
        step = _value(step_text, f"{name} step", 1, high - low + 1, {}) if slash else 1
        if head == "*":
            start, end = low, high
        elif "-" in head:
            a, _, b = head.partition("-")
            start, end = _value(a, name, low, high, names), _value(b, name, low, high, names)
            if start > end:
                raise CronError(f"{name}: the range {head!r} runs backwards")
        else:
            start = _value(head, name, low, high, names)
            end = high if slash else start
        out.update(range(start, end + 1, step))
    return frozenset(out)


def parse_cron(text: str) -> CronExpression:
    parts = text.split()
    if len(parts) not in (6, 7):
        raise CronError(
            f"expected 6 or 7 fields (seconds minutes hours day-of-month month day-of-week [year]), got {len(parts)}"
        )
    if (parts[3] == "?") == (parts[5] == "?"):
        raise CronError("exactly one of day-of-month and day-of-week must be '?' (as in Quartz)")
    if "?" in parts[:3] + parts[4:5] + parts[6:]:
        raise CronError("'?' is only allowed in day-of-month and day-of-week")
    fields = tuple(_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=False))
    return CronExpression(text, fields)


def in_window(windows: Iterable[str], epoch_ms: int) -> bool:
    """Whether ``epoch_ms`` is inside any of the (valid) window expressions."""
    return any(parse_cron(w).matches(epoch_ms) for w in windows)
