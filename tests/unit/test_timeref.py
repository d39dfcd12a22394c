"""memchat.usecases.recall.periods: the period a time expression names, relative to a moment."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memchat.usecases.recall.periods import period_in

# A Tuesday.
NOW = datetime(2023, 5, 30, 23, 40, tzinfo=UTC)


def day(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("what did I buy yesterday?", "2023-05-29", "2023-05-30"),
        ("the day before yesterday I ran", "2023-05-28", "2023-05-29"),
        ("what did I eat today", "2023-05-30", "2023-05-31"),
        ("two days ago I met Ana", "2023-05-27", "2023-05-30"),
        ("3 days ago", "2023-05-26", "2023-05-29"),
        ("a week ago", "2023-05-19", "2023-05-27"),
        ("a couple of weeks ago", "2023-05-12", "2023-05-20"),
        ("a month ago", "2023-04-14", "2023-05-16"),
        ("two years ago", "2021-01-01", "2022-01-01"),
        ("What did I buy last week?", "2023-05-22", "2023-05-29"),
        ("this week", "2023-05-29", "2023-06-05"),
        ("in the past week", "2023-05-23", "2023-05-31"),
        ("last weekend", "2023-05-27", "2023-05-29"),
        ("last month", "2023-04-01", "2023-05-01"),
        ("this month", "2023-05-01", "2023-06-01"),
        ("last year", "2022-01-01", "2023-01-01"),
        ("last Saturday", "2023-05-27", "2023-05-28"),
        ("on Tuesday", "2023-05-23", "2023-05-24"),
        ("in March", "2023-03-01", "2023-04-01"),
        ("in June", "2022-06-01", "2022-07-01"),
        ("during May", "2023-05-01", "2023-06-01"),
        ("last May", "2022-05-01", "2022-06-01"),
        ("since April", "2023-04-01", "2023-05-31"),
        ("March 2021", "2021-03-01", "2021-04-01"),
        ("back in 2020", "2020-01-01", "2021-01-01"),
        ("lately", "2023-04-30", "2023-05-31"),
    ],
)
def test_a_known_expression_names_its_period(text: str, start: str, end: str) -> None:
    period = period_in(text, NOW)
    assert period is not None
    assert (period.start, period.end) == (day(start), day(end))


@pytest.mark.parametrize(
    "text",
    [
        "hello there",
        "I may go to the park",  # "may" alone is the verb
        "How many days ago did I start?",  # no number
        "in 2031",  # not yet
        "0 days ago",
        "I mayday",
    ],
)
def test_no_clear_period_is_none(text: str) -> None:
    assert period_in(text, NOW) is None


def test_the_first_expression_wins() -> None:
    period = period_in("yesterday, not last month", NOW)
    assert period is not None and period.start == day("2023-05-29")


def test_periods_follow_the_moments_time_zone() -> None:
    from datetime import timedelta, timezone

    lisbon_evening = datetime(2023, 5, 30, 23, 40, tzinfo=timezone(timedelta(hours=-3)))
    period = period_in("yesterday", lisbon_evening)
    assert period is not None and period.start.isoformat() == "2023-05-29T00:00:00-03:00"


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("the airlines I flew with before today", None, "2023-05-30"),
        ("what I read until last week", None, "2023-05-22"),
        ("what did I cook after last weekend", "2023-05-29", None),
        ("the day before yesterday I ran", "2023-05-28", "2023-05-29"),  # one expression
    ],
)
def test_before_and_after_an_expression_name_the_time_beyond_it(
    text: str, start: str | None, end: str | None
) -> None:
    period = period_in(text, NOW)
    assert period is not None
    assert (period.start, period.end) == (
        day(start) if start else None,
        day(end) if end else None,
    )


FIRST_DAY = datetime(1, 1, 1, 12, tzinfo=UTC)  # a Monday
LAST_DAY = datetime(9999, 12, 31, 12, tzinfo=UTC)  # a Friday
EVERY_EXPRESSION = [
    "today",
    "yesterday",
    "the day before yesterday",
    "two days ago",
    "999 days ago",
    "999 weeks ago",
    "999 months ago",
    "999 years ago",
    "this week",
    "last week",
    "past week",
    "this weekend",
    "last weekend",
    "this month",
    "last month",
    "past month",
    "this year",
    "last year",
    "past year",
    "last Sunday",
    "on Friday",
    "in March",
    "last December",
    "since April",
    "in December",
    "March 9999",
    "December 9999",
    "back in 2020",
    "recently",
    "what I did before today",
    "what I did after today",
    "what I do after this year",
    "what I did before last year",
]


@pytest.mark.parametrize("now", [FIRST_DAY, LAST_DAY], ids=["first day", "last day"])
@pytest.mark.parametrize("text", EVERY_EXPRESSION)
def test_the_calendars_ends_cut_the_period(text: str, now: datetime) -> None:
    period = period_in(text, now)
    if period is not None:
        assert period.start is None or period.start.tzinfo is UTC
        assert period.start is None or period.end is None or period.start < period.end
        assert period.start is not None or period.end is not None


@pytest.mark.parametrize(
    ("text", "now", "start", "end"),
    [
        # Nothing of it is in the calendar: no period.
        ("last year", FIRST_DAY, "none", "none"),
        ("yesterday", FIRST_DAY, "none", "none"),
        ("last week", FIRST_DAY, "none", "none"),
        ("in March", FIRST_DAY, "none", "none"),
        ("what I did before today", FIRST_DAY, "none", "none"),
        # Part of it is: the part, open where the calendar ends.
        ("this week", FIRST_DAY, "0001-01-01", "0001-01-08"),
        ("two days ago", datetime(1, 1, 2, tzinfo=UTC), None, "0001-01-02"),
        ("recently", FIRST_DAY, None, "0001-01-02"),
        ("today", LAST_DAY, "9999-12-31", None),
        ("this year", LAST_DAY, "9999-01-01", None),
        ("this month", LAST_DAY, "9999-12-01", None),
        ("recently", LAST_DAY, "9999-12-01", None),
        ("last week", LAST_DAY, "9999-12-20", "9999-12-27"),
        ("what I did after today", LAST_DAY, "none", "none"),
    ],
)
def test_a_period_beyond_the_calendar_is_cut_or_none(
    text: str, now: datetime, start: str | None, end: str | None
) -> None:
    period = period_in(text, now)
    if start == "none":
        assert period is None
        return
    assert period is not None
    assert (period.start, period.end) == (
        day(start) if start else None,
        day(end) if end else None,
    )


def test_a_time_zone_at_the_calendars_end_keeps_its_days() -> None:
    from datetime import timedelta, timezone

    late = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))
    period = period_in("yesterday", late)
    assert period is not None and period.start is not None
    assert period.start.isoformat() == "9999-12-30T00:00:00-05:00"


@given(
    moment=st.datetimes(timezones=st.timezones()),
    text=st.sampled_from(EVERY_EXPRESSION),
)
def test_any_moment_names_a_period_in_the_calendar_or_none(moment: datetime, text: str) -> None:
    period = period_in(f"what did I do {text}", moment)
    if period is not None:
        assert period.start is not None or period.end is not None
        assert period.start is None or period.end is None or period.start < period.end
