"""Time expressions in a message, as the period they name relative to a moment.

Recall favours what was said in the period a message names ("what did I buy
last week?", "in March", "two days ago", "yesterday"): `period_in(text,
now)` reads the first expression it knows and returns [start, end) in
`now`'s time zone, or None. It reads English only, and only expressions
whose period is clear; a wrong guess costs little, as recall only adds the
period's best matches to its candidates (memchat.recall), it never drops
the others.

Known: today, yesterday, the day before yesterday; N days/weeks/months/years
ago (N a number or a word up to twelve, "a", "a couple of", "a few");
this/last/past week|month|year|weekend; last/on <weekday>; in/during/last
<month> [year]; in <year>; recently, lately (the last 30 days). After
"before"/"until"/"prior to", the time up to the period's start ("before
today"); after "after", the time from its end.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from memchat.store.records import Period

_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "a couple of": 2,
    "a few": 3,
    "several": 3,
}
_MONTHS = {
    name: index + 1
    for index, name in enumerate(
        [
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ]
    )
}
_WEEKDAYS = {
    name: index
    for index, name in enumerate(
        ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
    )
}
_COUNT = (
    r"(\d{1,3}|a couple of|a few|several|" + "|".join(k for k in _NUMBERS if " " not in k) + ")"
)
_UNIT = r"(day|week|month|year)s?"
_AGO = re.compile(rf"\b{_COUNT}\s+{_UNIT}\s+ago\b")
_RELATIVE = re.compile(r"\b(this|last|past|previous)\s+(week|month|year|weekend)\b")
_WEEKDAY = re.compile(r"\b(last|on|this past)\s+(" + "|".join(_WEEKDAYS) + r")\b")
# "may" alone is too often the verb: a month needs "in", "during", "last" or a year.
_MONTH = re.compile(
    r"\b(in|during|last|since|back in)\s+(?:early\s+|late\s+|mid-?)?("
    + "|".join(_MONTHS)
    + r")(?:\s+(\d{4}))?\b"
    r"|\b(" + "|".join(_MONTHS) + r")\s+(\d{4})\b"
)
_YEAR = re.compile(r"\b(?:in|during|back in)\s+((?:19|20)\d{2})\b")
_DAY_WORDS = re.compile(r"\b(the day before yesterday|yesterday|today|this morning|tonight)\b")
_RECENT = re.compile(r"\b(recently|lately|the other day)\b")


def period_in(text: str, now: datetime) -> Period | None:
    """The period the first time expression of `text` names, relative to
    `now` (its time zone's days), or None."""
    lowered = text.lower()
    found: list[tuple[int, Period]] = []
    for pattern, reader in _READERS:
        match = pattern.search(lowered)
        if match:
            period = reader(match, now)
            if period is not None:
                found.append((match.start(), period))
    if not found:
        return None
    start, period = min(found, key=lambda item: item[0])
    # "before today", "after last week": the time on the far side of it.
    leading = lowered[:start].rstrip()
    if leading.endswith(_BEFORE) and period.start is not None:
        return Period(None, period.start)
    if leading.endswith(_AFTER) and period.end is not None:
        return Period(period.end, None)
    return period


_BEFORE = (" before", " until", " prior to", " earlier than")
_AFTER = (" after", " later than")


def _day(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def _month_start(year: int, month: int, like: datetime) -> datetime:
    return _day(like).replace(year=year, month=month, day=1)


def _add_months(start: datetime, months: int) -> datetime:
    index = start.year * 12 + start.month - 1 + months
    return start.replace(year=index // 12, month=index % 12 + 1, day=1)


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBERS[word]


def _ago(match: re.Match[str], now: datetime) -> Period | None:
    count, unit = _count(match.group(1)), match.group(2)
    if count == 0:
        return None
    day = _day(now)
    # The named moment, with a margin as wide as the unit's usual vagueness.
    if unit == "day":
        center, margin = day - timedelta(days=count), timedelta(days=1)
        return Period(center - margin, center + timedelta(days=1) + margin)
    if unit == "week":
        center, margin = day - timedelta(weeks=count), timedelta(days=4)
    elif unit == "month":
        center, margin = day - timedelta(days=30 * count), timedelta(days=16)
    else:
        center, margin = day.replace(year=day.year - count, month=1, day=1), timedelta(days=0)
        return Period(center, center.replace(year=center.year + 1))
    return Period(center - margin, center + margin)


def _relative(match: re.Match[str], now: datetime) -> Period | None:
    which, unit = match.group(1), match.group(2)
    day = _day(now)
    current = which == "this"
    if unit in ("week", "weekend"):
        monday = day - timedelta(days=day.weekday())
        start = monday if current else monday - timedelta(weeks=1)
        if unit == "weekend":
            start += timedelta(days=5)
            return Period(start, start + timedelta(days=2))
        if which == "past":  # the last seven days
            return Period(day - timedelta(days=7), day + timedelta(days=1))
        return Period(start, start + timedelta(weeks=1))
    if unit == "month":
        first = day.replace(day=1)
        if which == "past":
            return Period(day - timedelta(days=31), day + timedelta(days=1))
        start = first if current else _add_months(first, -1)
        return Period(start, _add_months(start, 1))
    first = day.replace(month=1, day=1)
    if which == "past":
        return Period(day - timedelta(days=366), day + timedelta(days=1))
    start = first if current else first.replace(year=first.year - 1)
    return Period(start, start.replace(year=start.year + 1))


def _weekday(match: re.Match[str], now: datetime) -> Period | None:
    day = _day(now)
    back = (day.weekday() - _WEEKDAYS[match.group(2)]) % 7 or 7
    start = day - timedelta(days=back)
    return Period(start, start + timedelta(days=1))


def _month(match: re.Match[str], now: datetime) -> Period | None:
    if match.group(2):
        month, year_text, last = _MONTHS[match.group(2)], match.group(3), match.group(1) == "last"
    else:
        month, year_text, last = _MONTHS[match.group(4)], match.group(5), False
    if year_text:
        year = int(year_text)
    else:
        # The latest such month that has begun (this year's, or last year's).
        year = now.year if month < now.month or (month == now.month and not last) else now.year - 1
    start = _month_start(year, month, now)
    if start > now:
        return None
    end = _add_months(start, 1)
    if match.group(1) == "since":
        end = _day(now) + timedelta(days=1)
    return Period(start, end)


def _year(match: re.Match[str], now: datetime) -> Period | None:
    year = int(match.group(1))
    if year > now.year:
        return None
    start = _day(now).replace(year=year, month=1, day=1)
    return Period(start, start.replace(year=year + 1))


def _day_words(match: re.Match[str], now: datetime) -> Period | None:
    back = {"the day before yesterday": 2, "yesterday": 1}.get(match.group(1), 0)
    start = _day(now) - timedelta(days=back)
    return Period(start, start + timedelta(days=1))


def _recent(match: re.Match[str], now: datetime) -> Period | None:
    return Period(_day(now) - timedelta(days=30), _day(now) + timedelta(days=1))


_READERS = (
    (_AGO, _ago),
    (_RELATIVE, _relative),
    (_WEEKDAY, _weekday),
    (_MONTH, _month),
    (_YEAR, _year),
    (_DAY_WORDS, _day_words),
    (_RECENT, _recent),
)
