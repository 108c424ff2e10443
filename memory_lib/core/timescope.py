"""Times a question names ("last year", "in May 2023", "yesterday"), as a [since, until) window.

Search boosts hits created inside the window (RetrievalConfig.delta_time) and searches the archive
when the window reaches before the hot horizon. English only, calendar periods in UTC, the first
phrase found wins; a question naming no time gives None (no boost, no filter).
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
_MONTH_YEAR = re.compile(rf"\b({_MONTH})\.?,?\s+(?:of\s+)?((?:19|20)\d\d)\b", re.IGNORECASE)
# A bare month name counts only after "in"/"during"/"since": "may" is also a verb.
_IN_MONTH = re.compile(rf"\b(?:in|during|last|this)\s+({_MONTH})\b(?!\s*\d)", re.IGNORECASE)
_YEAR = re.compile(r"\b(?:in|during|of|since|from)\s+((?:19|20)\d\d)\b", re.IGNORECASE)
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


def parse_time_window(query: str, now: datetime) -> TimeWindow | None:
    """The period `query` names, relative to `now`, or None."""
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
