"""Times a question names ("on 31 Dec 2023", "last year", "in May 2023", "yesterday"), as a [since, until) window.

Search boosts hits created inside the window (RetrievalConfig.delta_time) and searches the archive
when the window reaches before the hot horizon. English only, calendar periods in UTC; a calendar day
wins over the other phrases, then the first phrase found; a question naming no time gives None (no
boost, no filter).

A named day ("31 Dec 2023", "the 10th of February 2024", "May 23, 2023", "2024-01-10", "10.01.2024")
covers the day before it to two days after it: people make plans for a day before it comes and tell
what happened in the days after, and a chat's clock need not be the question's time zone. A dotted date
is day first (10.01.2024 is 10 January); a slashed one (1/10/2024) is read as no date, because its
order depends on the writer's country. A day without a year is not read either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["TimeWindow", "parse_time_window"]

_MONTHS = {
    name: i + 1
    for i, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ]
    )
    for name in names
}
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_Y = r"((?:19|20)\d\d)"  # a year, captured
_MONTH_YEAR = re.compile(rf"\b({_MONTH})\.?,?\s+(?:of\s+)?{_Y}\b", re.IGNORECASE)
# A bare month name counts only after "in"/"during"/"since": "may" is also a verb.
_IN_MONTH = re.compile(rf"\b(?:in|during|last|this)\s+({_MONTH})\b(?!\s*\d)", re.IGNORECASE)
_YEAR = re.compile(rf"\b(?:in|during|of|since|from)\s+{_Y}\b", re.IGNORECASE)
_ORDINAL = r"(\d{1,2})(?:st|nd|rd|th)?"
# Each gives (year, month, day) from its match.
_DAYS: tuple[tuple[re.Pattern[str], tuple[int, int, int]], ...] = (
    (re.compile(rf"\b{_Y}-(\d{{1,2}})-(\d{{1,2}})\b"), (1, 2, 3)),  # 2024-01-10
    (re.compile(rf"\b(\d{{1,2}})\.(\d{{1,2}})\.{_Y}\b"), (3, 2, 1)),  # 10.01.2024, day first
    (  # 31 Dec 2023, the 10th of February, 2024
        re.compile(rf"\b{_ORDINAL}\s+(?:of\s+)?({_MONTH})\.?,?\s+{_Y}\b", re.IGNORECASE),
        (3, 2, 1),
    ),
    (  # May 23, 2023; December 1,2023; Dec 31st 2023
        re.compile(rf"\b({_MONTH})\.?\s+{_ORDINAL}\s*,?\s*{_Y}\b", re.IGNORECASE),
        (3, 1, 2),
    ),
)
# A named day's window: from a day before it to two days after it (see the module docstring).
DAY_BEFORE, DAYS_AFTER = timedelta(days=1), timedelta(days=2)
_RELATIVE = re.compile(r"\b(yesterday|today|(?:last|this|past)\s+(?:week|month|year))\b", re.IGNORECASE)


@dataclass(frozen=True)
class TimeWindow:
    since: datetime
    until: datetime
    phrase: str

    def contains(self, ts: datetime) -> bool:
        return self.since <= ts < self.until


def _month_start(year: int, month: int) -> datetime:
    return datetime(year, month, 1, tzinfo=UTC)


def _next_month(year: int, month: int) -> datetime:
    return _month_start(year + month // 12, month % 12 + 1)


def _relative(phrase: str, now: datetime) -> tuple[datetime, datetime]:
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    words = phrase.lower().split()
    if words == ["yesterday"]:
        return day - timedelta(days=1), day
    if words == ["today"]:
        return day, day + timedelta(days=1)
    which, unit = words
    if which == "past":  # a rolling period ending now
        span = {"week": 7, "month": 31, "year": 366}[unit]
        return now - timedelta(days=span), now + timedelta(seconds=1)
    if unit == "week":
        start = day - timedelta(days=day.weekday())
        return (start - timedelta(days=7), start) if which == "last" else (start, start + timedelta(days=7))
    if unit == "month":
        start = _month_start(day.year, day.month)
        if which == "this":
            return start, _next_month(day.year, day.month)
        prev = start - timedelta(days=1)
        return _month_start(prev.year, prev.month), start
    year = day.year - (1 if which == "last" else 0)
    return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)


def _named_day(query: str) -> TimeWindow | None:
    """The first calendar day `query` names with its year, widened (DAY_BEFORE, DAYS_AFTER), or None."""
    for pattern, (y, m, d) in _DAYS:
        for match in pattern.finditer(query):
            month = match.group(m)
            try:
                day = datetime(
                    int(match.group(y)),
                    int(month) if month.isdigit() else _MONTHS[month.lower()],
                    int(match.group(d)),
                    tzinfo=UTC,
                )
            except ValueError:  # 31.02.2024, 2024-13-01: not a day
                continue
            return TimeWindow(day - DAY_BEFORE, day + timedelta(days=1) + DAYS_AFTER, match.group(0))
    return None


def parse_time_window(query: str, now: datetime) -> TimeWindow | None:
    """The period `query` names, relative to `now`, or None."""
    if window := _named_day(query):
        return window
    if m := _MONTH_YEAR.search(query):
        month, year = _MONTHS[m.group(1).lower()], int(m.group(2))
        return TimeWindow(_month_start(year, month), _next_month(year, month), m.group(0))
    if m := _RELATIVE.search(query):
        since, until = _relative(m.group(1), now)
        return TimeWindow(since, until, m.group(0))
    if m := _IN_MONTH.search(query):
        month = _MONTHS[m.group(1).lower()]
        year = now.year if month <= now.month else now.year - 1  # the latest such month, not the future
        return TimeWindow(_month_start(year, month), _next_month(year, month), m.group(0))
    if m := _YEAR.search(query):
        year = int(m.group(1))
        return TimeWindow(datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC), m.group(0))
    return None
