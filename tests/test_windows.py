"""Maintenance windows: Quartz cron expressions (Strimzi's maintenanceTimeWindows) matched
in UTC, checked against a field-by-field reading of the same expression."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.windows import CronError, in_window, parse_cron

UTC = datetime.UTC


def _ms(t: datetime.datetime) -> int:
    return int(t.timestamp() * 1000)


def test_strimzis_example_is_every_day_from_midnight_to_two() -> None:
    expr = parse_cron("* * 0-1 ? * SUN,MON,TUE,WED,THU,FRI,SAT")
    day = datetime.datetime(2024, 3, 7, tzinfo=UTC)
    inside = [day, day.replace(hour=1, minute=59, second=59)]
    outside = [day.replace(hour=2), day - datetime.timedelta(seconds=1)]
    assert all(expr.matches(_ms(t)) for t in inside)
    assert not any(expr.matches(_ms(t)) for t in outside)


def test_day_of_week_names_and_numbers_follow_quartz() -> None:
    sunday = datetime.datetime(2024, 3, 10, 12, tzinfo=UTC)  # a Sunday
    assert parse_cron("* * * ? * SUN").matches(_ms(sunday))
    assert parse_cron("* * * ? * 1").matches(_ms(sunday))  # Quartz: 1 = SUN
    assert not parse_cron("* * * ? * MON-FRI").matches(_ms(sunday))
    assert parse_cron("* * * ? * 2-6").matches(_ms(sunday + datetime.timedelta(days=1)))


def test_steps_lists_months_and_years() -> None:
    t = datetime.datetime(2030, 7, 15, 3, 30, 0, tzinfo=UTC)
    assert parse_cron("0 0/15 3 15 JUL ? 2030").matches(_ms(t))
    assert not parse_cron("0 0/15 3 15 JUL ? 2031").matches(_ms(t))
    assert not parse_cron("0 0/20 3 15 JUL ? *").matches(_ms(t))
    assert parse_cron("0 10,30,50 * ? * *").matches(_ms(t))
    assert in_window(["* * 9 ? * *", "* 30 3 ? * *"], _ms(t))
    assert not in_window([], _ms(t))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("* * * ? *", "expected 6 or 7 fields"),
        ("* * * * * *", "exactly one of day-of-month and day-of-week"),
        ("* * * ? * ?", "exactly one of day-of-month and day-of-week"),
        ("? * * ? * *", "only allowed in day-of-month and day-of-week"),
        ("* * 24 ? * *", "hours: 24 is outside 0-23"),
        ("* * * L * ?", "L, W and # are not supported"),
        ("* * * ? * 6#3", "L, W and # are not supported"),
        ("* * 5-2 ? * *", "runs backwards"),
        ("* * * ? FOO *", "not a number"),
        ("* 0/0 * ? * *", "step"),
    ],
)
def test_bad_expressions_say_why(text: str, fragment: str) -> None:
    with pytest.raises(CronError, match=fragment):
        parse_cron(text)


def _allowed(field: str, low: int, high: int) -> set[int]:
    """The reference reading of one numeric field: ``*``, ``a``, ``a-b``, ``x/n``, lists."""
    if field in ("*", "?"):
        return set(range(low, high + 1))
    out: set[int] = set()
    for item in field.split(","):
        head, _, step = item.partition("/")
        if head == "*":
            a, b = low, high
        elif "-" in head:
            a, b = (int(x) for x in head.split("-"))
        else:
            a = int(head)
            b = high if step else a
        out |= set(range(a, b + 1, int(step) if step else 1))
    return out


def _items(low: int, high: int) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    single = value.map(str)
    span = st.tuples(value, value).map(lambda ab: f"{min(ab)}-{max(ab)}")
    stepped = st.tuples(st.sampled_from(["*", str(low)]) | span, st.integers(1, high - low + 1)).map(
        lambda hs: f"{hs[0]}/{hs[1]}"
    )
    return st.one_of(single, span, stepped)


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    return st.one_of(st.just("*"), st.lists(_items(low, high), min_size=1, max_size=3).map(",".join))


@settings(max_examples=300)
@given(
    seconds=_field(0, 59),
    minutes=_field(0, 59),
    hours=_field(0, 23),
    dom=_field(1, 31),
    months=_field(1, 12),
    instant=st.datetimes(datetime.datetime(2000, 1, 1), datetime.datetime(2090, 12, 31)),
    dom_side=st.booleans(),
)
def test_matching_agrees_with_a_field_by_field_reading(
    seconds: str, minutes: str, hours: str, dom: str, months: str, instant: datetime.datetime, dom_side: bool
) -> None:
    dow = "?" if dom_side else "*"
    day = dom if dom_side else "?"
    expr = parse_cron(f"{seconds} {minutes} {hours} {day} {months} {dow}")
    t = instant.replace(tzinfo=UTC, microsecond=0)
    want = (
        t.second in _allowed(seconds, 0, 59)
        and t.minute in _allowed(minutes, 0, 59)
        and t.hour in _allowed(hours, 0, 23)
        and t.day in _allowed(day, 1, 31)
        and t.month in _allowed(months, 1, 12)
    )
    assert expr.matches(_ms(t)) == want
