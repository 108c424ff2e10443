"""The input rules of every public entry point, in one place.

Each rule takes the field's name and the value and returns the value to use, or raises
InvalidInputError(field, value, reason). Entry points (both clients, store insert, the write path,
context assembly, backup parsing) call these before anything reaches Postgres, the embedder or the
object store, so bad input never surfaces as a driver error and nothing is written.

Documented limits and choices:

* Text (content, user_id, domain, tags, queries) is a `str` (never coerced from a number), without
  NUL bytes (Postgres text cannot hold them) and valid Unicode (no lone surrogates: UTF-8 cannot
  encode them). Required text must have at least one visible character: whitespace, control and
  zero-width/format characters (U+200B, U+FEFF, ...) alone count as empty.
* A search query or text_query is at most MAX_QUERY_CHARS (4,000) characters. Much longer queries
  make Postgres' full-text parser recurse past its stack limit ("stack depth limit exceeded" for
  ~1 MB, or ~20,000 OR-ed terms); 4,000 characters is at most 2,000 terms, well below that.
* Timestamps must be timezone-aware: a `datetime` with tzinfo, or an ISO 8601 string WITH an offset
  ("2024-01-01T00:00:00+00:00", "...Z"), which is parsed. A date-only or offset-less string
  ("2024-01-01") is naive like a naive datetime and is refused; numbers (epoch seconds) are refused.
* Limits are plain integers (not bool) in 0..MAX_LIMIT (1,000).
* Flags (pinned, include_past, record_access, allow_secrets) are real booleans: 'yes', 1 and None
  are refused, never read by truthiness.
* Numbers (importance) are finite reals, not bool and not strings.
"""

from __future__ import annotations

import math
import numbers
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar, cast

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, TypeAdapter, ValidationError

from .errors import InvalidInputError

MAX_QUERY_CHARS = 4_000
MAX_LIMIT = 1_000
MAX_USER_ID_CHARS = 200
MAX_CONTENT_CHARS = 100_000
MAX_LABEL_CHARS = 200  # domain, embedding_model, actor, category names
MAX_TAG_CHARS = 100
MAX_TTL_DAYS = 36_500  # a century: beyond it a TTL means "never" (use None)

# Characters that show nothing on their own: whitespace, controls, zero-width and other format marks.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})

T = TypeVar("T")
S = TypeVar("S", bound=str)  # choice: one of the given strings, typed as they are (e.g. a Literal)


# --------------------------------------------------------------------------- text


def storable(field: str, value: str) -> str:
    """A str that Postgres text/jsonb can hold: no NUL, encodable as UTF-8. The rule for every
    string that is written, whether or not it may be empty."""
    if "\x00" in value:
        raise InvalidInputError(field, value, "contains a NUL byte (Postgres text cannot store it)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            field, value, f"is not valid Unicode ({exc.reason} at position {exc.start})"
        ) from None
    return value


def has_visible_text(value: str) -> bool:
    return any(not c.isspace() and unicodedata.category(c) not in _INVISIBLE_CATEGORIES for c in value)


def text(field: str, value: object, *, max_chars: int, reason_empty: str = "is empty") -> str:
    """Required text: a str, storable, with a visible character, at most `max_chars` long."""
    if not isinstance(value, str):
        raise InvalidInputError(field, value, f"must be a string, not {type(value).__name__}")
    storable(field, value)
    if not has_visible_text(value):
        raise InvalidInputError(field, value, f"{reason_empty} (only whitespace or invisible characters)")
    if len(value) > max_chars:
        raise InvalidInputError(field, value, f"is {len(value)} characters long; the maximum is {max_chars}")
    return value


def optional_text(field: str, value: object, *, max_chars: int) -> str | None:
    return None if value is None else text(field, value, max_chars=max_chars)


def user(value: object) -> str:
    """Every call names its user: a missing or blank user_id is an error, never 'all users'."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError("user_id", value, "is required: a non-empty string")
    if "\x00" in value or len(value) > MAX_USER_ID_CHARS:
        raise InvalidInputError("user_id", value, "must be at most 200 characters without NUL bytes")
    return text("user_id", value, max_chars=MAX_USER_ID_CHARS)


def query_text(field: str, value: object) -> str:
    """A search query: text of at most MAX_QUERY_CHARS characters."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(field, value, "must be a non-empty string")
    return text(field, value, max_chars=MAX_QUERY_CHARS)


def optional_query_text(field: str, value: object) -> str | None:
    return None if value is None else query_text(field, value)


def tag_list(field: str, value: object) -> list[str] | None:
    """Tags as given (normalized by search.normalize_tags): a sequence of short storable strings."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable) or isinstance(value, Mapping):
        raise InvalidInputError(field, value, "pass a sequence of tags, not one string")
    out = list(value)
    for tag in out:
        if not isinstance(tag, str) or not tag.strip() or len(tag) > MAX_TAG_CHARS:
            raise InvalidInputError(
                field, tag, "each tag must be a non-empty string of at most 100 characters"
            )
        text(field, tag, max_chars=MAX_TAG_CHARS)
    return out


def text_sequence(field: str, value: object, *, max_chars: int = MAX_LABEL_CHARS) -> tuple[str, ...] | None:
    """A filter's list of values (domains, categories): each one storable text."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable) or isinstance(value, Mapping):
        raise InvalidInputError(field, value, "pass a sequence, not one string")
    items = tuple(value)
    for item in items:
        text(field, item, max_chars=max_chars)
    return items


def batch_key(field: str, value: object) -> str:
    """An archival batch's key: storable text with a visible character (an empty key is never 'the default')."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(field, value, "must be a non-empty string")
    return text(field, value, max_chars=MAX_LABEL_CHARS)


# --------------------------------------------------------------------------- scalars


_DATETIME = TypeAdapter(datetime)


def timestamp(field: str, value: object) -> datetime:
    """An aware datetime, or an ISO 8601 string with an offset (parsed); anything else is refused."""
    if isinstance(value, str):
        try:
            parsed = _DATETIME.validate_python(value, strict=False)
        except ValidationError:
            raise InvalidInputError(
                field, value, "is not an ISO 8601 timestamp (e.g. '2024-01-01T00:00:00+00:00')"
            ) from None
        if parsed.tzinfo is None:
            raise InvalidInputError(
                field, value, "must be timezone-aware: give an offset, e.g. '2024-01-01T00:00:00+00:00'"
            )
        return parsed
    if not isinstance(value, datetime):
        raise InvalidInputError(
            field, value, f"must be a timezone-aware datetime or ISO 8601 string, not {type(value).__name__}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(field, value, "must be timezone-aware")
    return value


def optional_timestamp(field: str, value: object) -> datetime | None:
    return None if value is None else timestamp(field, value)


def row_limit(field: str, value: object, *, maximum: int = MAX_LIMIT) -> int | None:
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 0 <= int(value) <= maximum:
        raise InvalidInputError(field, value, f"must be an integer between 0 and {maximum}")
    return int(value)


def non_negative_int(field: str, value: object) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or int(value) < 0:
        raise InvalidInputError(field, value, "must be an integer >= 0")
    return int(value)


def ttl_days(field: str, value: object) -> int | None:
    """None (no TTL), 0 (pinned canonical fact) or a whole number of days up to MAX_TTL_DAYS."""
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise InvalidInputError(
            field, value, f"must be None or an integer between 0 and {MAX_TTL_DAYS} (days)"
        )
    if not 0 <= int(value) <= MAX_TTL_DAYS:
        raise InvalidInputError(field, value, f"must be between 0 (pinned) and {MAX_TTL_DAYS} days")
    return int(value)


def boolean(field: str, value: object) -> bool:
    """True or False only: a string like 'no' is truthy, so nothing is read by truthiness."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidInputError(field, value, "must be True or False")


def optional_boolean(field: str, value: object) -> bool | None:
    return None if value is None else boolean(field, value)


def number(field: str, value: object, *, low: float, high: float) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise InvalidInputError(field, value, f"must be a number between {low} and {high}")
    out = float(value)
    if not math.isfinite(out) or not low <= out <= high:
        raise InvalidInputError(field, value, f"must be a finite number between {low} and {high}")
    return out


def choice(field: str, value: object, options: Sequence[S]) -> S:
    if not isinstance(value, str) or value not in options:
        quoted = [repr(o) for o in options]
        shown = ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
        raise InvalidInputError(field, value, f"must be {shown}")
    return cast(S, value)  # equal to one of `options`, checked above


def uuid_value(field: str, value: object) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        raise InvalidInputError(field, value, "must be a UUID")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidInputError(field, value, "must be a UUID") from None


def optional_uuid(field: str, value: object) -> uuid.UUID | None:
    return None if value is None else uuid_value(field, value)


# --------------------------------------------------------------------------- search filters


def check_filters(filters: Any, *, field: str = "filters") -> Any:
    """Re-check a SearchFilters: its values are bound into SQL. Categories and tags are checked by
    SearchFilters itself; here every value must also be storable text and the window aware."""
    text_sequence(f"{field}.categories", getattr(filters, "categories", None))
    text_sequence(f"{field}.domains", getattr(filters, "domains", None))
    tag_list(f"{field}.required_tags", getattr(filters, "required_tags", None))
    for a, b in (("since", "until"), ("seen_since", "seen_until")):
        low = optional_timestamp(f"{field}.{a}", getattr(filters, a, None))
        high = optional_timestamp(f"{field}.{b}", getattr(filters, b, None))
        if low is not None and high is not None and low >= high:
            raise InvalidInputError(f"{field}.{b}", high, f"must be after {field}.{a}={low}")
    return filters


# --------------------------------------------------------------------------- pydantic glue


def rule(fn: Callable[..., T], **kwargs: Any) -> BeforeValidator:
    """A pydantic BeforeValidator running `fn(field_name, value, **kwargs)`: a model field gets the
    same rule and the same message as a plain argument."""

    def run(value: Any, info: Any) -> T:
        return fn(info.field_name, value, **kwargs)

    return BeforeValidator(run)


def validated(model: type[BaseModel], data: Mapping[str, Any], *, prefix: str = "") -> Any:
    """`model.model_validate(data)`, with the first error as InvalidInputError naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise as_invalid_input(exc, prefix=prefix) from None


def as_invalid_input(exc: ValidationError, *, prefix: str = "") -> InvalidInputError:
    err = exc.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidInputError):
        if prefix and not cause.field.startswith(prefix):
            return type(cause)(f"{prefix}{cause.field}", cause.value, cause.reason)
        return cause
    field = ".".join(str(p) for p in err["loc"]) or prefix.rstrip(".") or "input"
    msg = err["msg"].removeprefix("Value error, ")
    return InvalidInputError(f"{prefix}{field}" if err["loc"] else field, err.get("input"), msg)


class SearchParams(BaseModel):
    """Everything a search takes besides the filters object, validated before the query is embedded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user_id: Annotated[str, BeforeValidator(user)]
    query: Annotated[str, rule(query_text)]
    text_query: Annotated[str | None, rule(optional_query_text)] = None
    limit: Annotated[int | None, rule(row_limit)] = None
    archived_limit: Annotated[int | None, rule(row_limit)] = None
    tags: Annotated[list[str] | None, rule(tag_list)] = None
    include_past: Annotated[bool, rule(boolean)] = False
    phase2: Annotated[str, rule(choice, options=("auto", "always", "never"))] = "auto"
    phase3: Annotated[str, rule(choice, options=("auto", "always", "never"))] = "auto"
    record_access: Annotated[bool, rule(boolean)] = False
    follow_links: Annotated[bool, rule(boolean)] = False
    include_superseded: Annotated[bool, rule(boolean)] = False
    debug: Annotated[bool | None, rule(optional_boolean)] = None
    now: Annotated[datetime | None, rule(optional_timestamp)] = None


def require_user_id(user_id: object) -> str:
    """Every call names its user: a missing or blank user_id is an error, never 'all users'."""
    if not isinstance(user_id, str) or not user_id.strip():
        raise InvalidInputError("user_id", user_id, "is required: a non-empty string")
    if "\x00" in user_id or len(user_id) > 200:
        raise InvalidInputError("user_id", user_id, "must be at most 200 characters without NUL bytes")
    return user_id


def normalize_tags(tags: Sequence[str] | None, *, field: str = "tags") -> tuple[str, ...]:
    """Tags compare case-insensitively: stripped, casefolded, unique, sorted."""
    if tags is None:
        return ()
    if isinstance(tags, str):
        raise InvalidInputError(field, tags, "pass a sequence of tags, not one string")
    out: set[str] = set()
    for tag in tags:
        if not isinstance(tag, str) or not tag.strip() or "\x00" in tag or len(tag) > 100:
            raise InvalidInputError(
                field, tag, "each tag must be a non-empty string of at most 100 characters"
            )
        out.add(" ".join(tag.split()).casefold())
    return tuple(sorted(out))


def utc_now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    return timestamp("now", now).astimezone(UTC)
