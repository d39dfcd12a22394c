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
from datetime import date, datetime, time

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
    found: list[tuple[int, _Days]] = []
    for pattern, reader in _READERS:
        match = pattern.search(lowered)
        if match:
            days = reader(match, now)
            if days is not None:
                found.append((match.start(), days))
    if not found:
        return None
    start, (first, last) = min(found, key=lambda item: item[0])
    # "before today", "after last week": the time on the far side of it.
    leading = lowered[:start].rstrip()
    if leading.endswith(_BEFORE) and first is not None:
        return _period(None, first, now)
    if leading.endswith(_AFTER) and last is not None:
        return _period(last, None, now)
    return _period(first, last, now)


_BEFORE = (" before", " until", " prior to", " earlier than")
_AFTER = (" after", " later than")

# [first, last) as proleptic Gregorian day numbers (date.toordinal()'s, but
# any integer: before day 1 or after date.max too); None: open on that side.
_Days = tuple[int | None, int | None]
_FIRST_DAY = date.min.toordinal()
_LAST_DAY = date.max.toordinal()
_DAYS_BEFORE_MONTH = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)


def _period(first: int | None, last: int | None, now: datetime) -> Period | None:
    """The days [first, last) as local midnights of `now`'s zone, cut to the
    calendar (a bound beyond it left open); None if none of it is in it."""
    if (last is not None and last <= _FIRST_DAY) or (first is not None and first > _LAST_DAY):
        return None
    start = _midnight(first, now) if first is not None and first >= _FIRST_DAY else None
    end = _midnight(last, now) if last is not None and last <= _LAST_DAY else None
    if start is None and end is None:
        return None  # the whole calendar: no period to favour
    return Period(start, end)


def _midnight(day: int, now: datetime) -> datetime:
    return datetime.combine(date.fromordinal(day), time(), tzinfo=now.tzinfo)


def _today(now: datetime) -> int:
    return now.toordinal()


def _month_start(year: int, month: int) -> int:
    """The day number of the first of `month` in `year`, any year."""
    before = year - 1
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = before * 365 + before // 4 - before // 100 + before // 400
    return days + _DAYS_BEFORE_MONTH[month - 1] + (1 if leap and month > 2 else 0) + 1


def _months_on(year: int, month: int, months: int) -> int:
    """The first day of the month `months` after (or before) year-month."""
    index = year * 12 + month - 1 + months
    return _month_start(index // 12, index % 12 + 1)


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBERS[word]


def _ago(match: re.Match[str], now: datetime) -> _Days | None:
    count, unit = _count(match.group(1)), match.group(2)
    if count == 0:
        return None
    day = _today(now)
    # The named moment, with a margin as wide as the unit's usual vagueness.
    if unit == "day":
        center = day - count
        return center - 1, center + 2
    if unit == "week":
        center, margin = day - 7 * count, 4
    elif unit == "month":
        center, margin = day - 30 * count, 16
    else:
        year = now.year - count
        return _month_start(year, 1), _month_start(year + 1, 1)
    return center - margin, center + margin


def _relative(match: re.Match[str], now: datetime) -> _Days | None:
    which, unit = match.group(1), match.group(2)
    day = _today(now)
    current = which == "this"
    if unit in ("week", "weekend"):
        monday = day - now.weekday()
        start = monday if current else monday - 7
        if unit == "weekend":
            return start + 5, start + 7
        if which == "past":  # the last seven days
            return day - 7, day + 1
        return start, start + 7
    if unit == "month":
        if which == "past":
            return day - 31, day + 1
        back = 0 if current else -1
        return _months_on(now.year, now.month, back), _months_on(now.year, now.month, back + 1)
    if which == "past":
        return day - 366, day + 1
    year = now.year if current else now.year - 1
    return _month_start(year, 1), _month_start(year + 1, 1)


def _weekday(match: re.Match[str], now: datetime) -> _Days | None:
    back = (now.weekday() - _WEEKDAYS[match.group(2)]) % 7 or 7
    start = _today(now) - back
    return start, start + 1


def _month(match: re.Match[str], now: datetime) -> _Days | None:
    if match.group(2):
        month, year_text, last = _MONTHS[match.group(2)], match.group(3), match.group(1) == "last"
    else:
        month, year_text, last = _MONTHS[match.group(4)], match.group(5), False
    if year_text:
        year = int(year_text)
    else:
        # The latest such month that has begun (this year's, or last year's).
        year = now.year if month < now.month or (month == now.month and not last) else now.year - 1
    start = _month_start(year, month)
    if start > _today(now):
        return None
    if match.group(1) == "since":
        return start, _today(now) + 1
    return start, _months_on(year, month, 1)


def _year(match: re.Match[str], now: datetime) -> _Days | None:
    year = int(match.group(1))
    if year > now.year:
        return None
    return _month_start(year, 1), _month_start(year + 1, 1)


def _day_words(match: re.Match[str], now: datetime) -> _Days | None:
    back = {"the day before yesterday": 2, "yesterday": 1}.get(match.group(1), 0)
    start = _today(now) - back
    return start, start + 1


def _recent(match: re.Match[str], now: datetime) -> _Days | None:
    day = _today(now)
    return day - 30, day + 1


_READERS = (
    (_AGO, _ago),
    (_RELATIVE, _relative),
    (_WEEKDAY, _weekday),
    (_MONTH, _month),
    (_YEAR, _year),
    (_DAY_WORDS, _day_words),
    (_RECENT, _recent),
)
