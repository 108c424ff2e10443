"""Token-budgeted context assembly.

Three parts, each within its own budget (defaults: 2000 summaries, 3000 recent turns, 1500 retrieved
snippets), and all of them within total - reserve (8000 - 1500), or a smaller `max_tokens`:

* summaries, by level (the summary hierarchy): digests of level 2+ ("[digest]": the user's active digests
  and phase 3's digest hits), then level 1, archived hits' summaries ("[archived]") and summaries the
  caller passes (level 1 unless the ContextItem says otherwise). Packed highest level first, newest
  first within a level, so lower and older ones are left out; in the prompt highest level first,
  oldest first within a level.
* recent turns: the conversation, newest first and contiguous (an older turn never comes back once a
  newer one did not fit); a newest turn larger than the whole part keeps its end, marked "…".
* snippets: hot hits, best first.

Near-duplicates are dropped first (recent turns win over snippets, snippets over summaries). When
the parts together exceed the total, trimming goes in this order: snippets (worst first), then
recent turns (oldest first), then summaries (lowest level first, oldest first within a level). Every block keeps its provenance and its
token count. Token counting is pluggable (a count must be an integer >= 0); the default is an
offline approximation (no tokenizer download) that errs on the high side.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import numpy as np

from ..core import validation
from ..core.config import ContextBudget
from ..core.errors import InvalidInputError
from ..observability import telemetry
from ..observability.trace import span
from ..write.write_path import content_words
from .consolidated import ConsolidatedHit
from .types import Provenance, SearchHit, SearchResult

TokenCounter = Callable[[str], int]
Part = Literal["summaries", "recent_turns", "snippets"]
PARTS: tuple[Part, ...] = ("summaries", "recent_turns", "snippets")
# ContextItem.source of retrieved memory material (search hits, digests, facts): what the injection
# metrics count. Turns and the caller's own summaries are not retrieved.
MEMORY_SOURCES = frozenset({"hot", "archived", "digest", "fact"})

# Two texts whose content-word sets overlap this much (Jaccard) say the same thing.
TRUNCATION_MARK = "…"

_PIECE = re.compile(r"\w+|[^\w\s]")


def approx_token_count(text: str) -> int:
    """Offline and deterministic: a word costs ceil(len/4) tokens (at least 1), any other symbol 1.

    BPE tokenizers (cl100k, o200k, Claude's) give about 4 characters of English per token and split
    long or rare words into several pieces; this count is usually a little above theirs, which is the
    safe side for a budget. Pass a real tokenizer's counter for exact figures.
    """
    return sum(math.ceil(len(p) / 4) if p[0].isalnum() or p[0] == "_" else 1 for p in _PIECE.findall(text))


@dataclass(frozen=True)
class ContextItem:
    """Something that may go into the context, before budgeting."""

    text: str
    source: str  # "hot", "archived", "turn" or "caller"
    created_at: datetime | None = None
    role: str | None = None
    score: float | None = None
    provenance: Provenance | None = None
    label: str = ""  # shown before the text ("[archived]"), ignored when comparing texts
    level: int = 1  # summaries: 1 = one memory's summary, 2+ = digests (a month, a year, ...)

    def __post_init__(self) -> None:
        # Items are sorted by created_at next to hits (aware UTC): a naive time cannot be compared.
        for name in ("text", "source", "label"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidInputError(f"ContextItem.{name}", value, "must be a string")
            validation.storable(f"ContextItem.{name}", value)
        if self.role is not None:
            validation.text("ContextItem.role", self.role, max_chars=validation.MAX_LABEL_CHARS)
        if self.score is not None:
            validation.number("ContextItem.score", self.score, low=-math.inf, high=math.inf)
        created = validation.optional_timestamp("ContextItem.created_at", self.created_at)
        object.__setattr__(self, "created_at", created)
        if isinstance(self.level, bool) or not isinstance(self.level, int) or not 1 <= self.level <= 100:
            raise InvalidInputError("ContextItem.level", self.level, "must be an integer from 1 to 100")

    @classmethod
    def from_hit(cls, hit: SearchHit) -> ContextItem:
        return cls(
            hit.text, hit.source, hit.provenance.created_at, None, hit.scores.final, hit.provenance, hit.label
        )

    @classmethod
    def from_consolidated(cls, hit: ConsolidatedHit) -> ContextItem:
        """A digest (its level) or a fact, labelled with its period or validity and its source count."""
        text = f"{hit.text} ({hit.interval}; from {len(hit.source_memory_ids)} memories)"
        label = f"[digest L{hit.level}]" if hit.kind == "digest" else "[fact]"
        return cls(text, hit.kind, hit.created_at, None, hit.score, None, label, hit.level or 1)

    @property
    def prompt_text(self) -> str:
        return f"{self.label} {self.text}" if self.label else self.text


@dataclass(frozen=True)
class ContextBlock:
    part: Part
    text: str
    tokens: int
    source: str
    role: str | None = None
    created_at: datetime | None = None
    score: float | None = None
    provenance: Provenance | None = None
    truncated: bool = False
    level: int | None = None  # summaries only


@dataclass(frozen=True)
class AssembledContext:
    """Blocks in prompt order: summaries (highest level first, oldest first within a level), snippets (best
    first), recent turns (in order)."""

    blocks: list[ContextBlock]
    budget: ContextBudget
    available: int  # what the three parts together may use
    dropped_duplicates: int
    dropped_for_budget: int
    # Retrieved memories (MEMORY_SOURCES: hits, digests, facts) among the items offered, before any was
    # dropped: the denominator of injection_hit_rate.
    offered_memories: int = 0

    def part(self, name: Part) -> list[ContextBlock]:
        return [b for b in self.blocks if b.part == name]

    @property
    def tokens_by_part(self) -> dict[Part, int]:
        return {p: sum(b.tokens for b in self.blocks if b.part == p) for p in PARTS}

    @property
    def total_tokens(self) -> int:
        return sum(b.tokens for b in self.blocks)

    @property
    def injected_memories(self) -> int:
        """Blocks of retrieved memory material (MEMORY_SOURCES) in the context."""
        return sum(1 for b in self.blocks if b.source in MEMORY_SOURCES)

    @property
    def injection_hit_rate(self) -> float | None:
        """Share of the retrieved memories offered that made it into the context (None: none offered).
        A memory dropped as a near-duplicate or for the budget is a miss."""
        return self.injected_memories / self.offered_memories if self.offered_memories else None

    @property
    def memory_token_share(self) -> float | None:
        """Tokens of retrieved memory material / tokens of the whole context (None: empty context)."""
        total = self.total_tokens
        return sum(b.tokens for b in self.blocks if b.source in MEMORY_SOURCES) / total if total else None

    def render(self) -> str:
        """The blocks' texts one per line; turns as 'role: text'. Separators are covered by the reserve."""
        return "\n".join(f"{b.role}: {b.text}" if b.role else b.text for b in self.blocks)


Turn = str | Mapping[str, str] | ContextItem


def _turn_item(turn: Turn, index: int) -> ContextItem:
    if isinstance(turn, ContextItem):
        return turn
    try:
        if isinstance(turn, str):
            return ContextItem(turn, "turn")
        if isinstance(turn, Mapping) and isinstance(turn.get("content"), str):
            return ContextItem(turn["content"], "turn", role=turn.get("role"))
    except InvalidInputError as exc:
        raise InvalidInputError(f"recent_turns[{index}]", turn, exc.reason) from None
    raise InvalidInputError(
        f"recent_turns[{index}]", turn, "must be a string or a {'role', 'content'} mapping"
    )


def _summary_item(item: str | ContextItem | SearchHit, index: int, part: str = "summaries") -> ContextItem:
    if isinstance(item, SearchHit):
        return ContextItem.from_hit(item)
    if isinstance(item, ContextItem):
        return item
    if isinstance(item, str):
        try:
            return ContextItem(item, "caller")
        except InvalidInputError as exc:
            raise InvalidInputError(f"{part}[{index}]", item, exc.reason) from None
    raise InvalidInputError(f"{part}[{index}]", item, "must be a string, a ContextItem or a SearchHit")


def _sequence(field: str, value: object) -> list[object]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidInputError(field, value, "must be a list")
    return list(value)


def prepare_turns(recent_turns: Sequence[Turn]) -> list[ContextItem]:
    """Recent turns as ContextItems; a bad one raises InvalidInputError naming recent_turns[i]."""
    return [_turn_item(t, i) for i, t in enumerate(_sequence("recent_turns", recent_turns))]  # type: ignore[arg-type]


def prepare_items(
    items: Sequence[str | ContextItem | SearchHit], part: Literal["summaries", "snippets"]
) -> list[ContextItem]:
    """Summaries or snippets as ContextItems; a bad one raises InvalidInputError naming part[i]."""
    return [_summary_item(s, i, part) for i, s in enumerate(_sequence(part, items))]  # type: ignore[arg-type]


def check_max_tokens(max_tokens: object) -> int | None:
    if max_tokens is None:
        return None
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise InvalidInputError("max_tokens", max_tokens, "must be >= 0")
    return max_tokens


def check_assembly_options(budget: object, counter: object) -> None:
    if budget is not None and not isinstance(budget, ContextBudget):
        raise InvalidInputError("budget", budget, "must be a ContextBudget")
    if counter is not None:
        check_counter(counter)


# Counted once when a counter is given: a counter that cannot count fails before any search or write.
_PROBE_TEXT = "The user prefers a cortado before 10 am."


def check_counter(counter: object, field: str = "counter") -> TokenCounter:
    """`counter`, checked on a probe text and wrapped so every count it returns is checked too."""
    if not callable(counter):
        raise InvalidInputError(field, counter, "must be a callable returning a token count")
    checked = counter if isinstance(counter, _CheckedCounter) else _CheckedCounter(counter, field)
    checked(_PROBE_TEXT)
    return checked


class _CheckedCounter:
    """A token count is an integer >= 0: anything else would break the budget arithmetic, so it raises
    InvalidInputError naming the counter's field and the value it returned."""

    def __init__(self, counter: Callable[[str], object], field: str):
        self.counter, self.field = counter, field

    def __call__(self, text: str) -> int:
        n = self.counter(text)
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or n < 0:
            raise InvalidInputError(
                self.field,
                n,
                f"returned for a text of {len(text)} characters: a token count must be an integer >= 0",
            )
        return int(n)


class _DuplicateFilter:
    def __init__(self, jaccard: float) -> None:
        self._jaccard = jaccard
        self._seen: list[tuple[frozenset[str], str]] = []

    def is_new(self, text: str) -> bool:
        words = frozenset(content_words(text))
        flat = " ".join(text.split()).casefold()
        for other_words, other_flat in self._seen:
            if words and other_words:
                if len(words & other_words) / len(words | other_words) >= self._jaccard:
                    return False
            elif flat == other_flat:
                return False
        self._seen.append((words, flat))
        return True


def _tail_to_fit(text: str, budget: int, counter: TokenCounter) -> str | None:
    """The longest ending of `text`, marked as cut, that fits `budget` tokens (None when none does)."""
    lo, hi = 1, len(text)  # start index of the kept tail
    best: str | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = TRUNCATION_MARK + text[mid:].lstrip()
        if counter(candidate) <= budget:
            best, hi = candidate, mid - 1
        else:
            lo = mid + 1
    return best if best and best != TRUNCATION_MARK else None


def assemble_context(
    *,
    summaries: Sequence[str | ContextItem | SearchHit] = (),
    recent_turns: Sequence[Turn] = (),
    snippets: Sequence[str | ContextItem | SearchHit] = (),
    budget: ContextBudget | None = None,
    counter: TokenCounter = approx_token_count,
    max_tokens: int | None = None,
) -> AssembledContext:
    """Pack the three parts within their budgets. `recent_turns` are in conversation order (oldest
    first); `snippets` best first; `summaries` in any order (they are ordered by created_at, an item
    without one counting as newest)."""
    check_assembly_options(budget, None)
    counter = check_counter(counter)  # every count it returns is checked
    budget = budget or ContextBudget()
    available = budget.total - budget.reserve
    limit = check_max_tokens(max_tokens)
    if limit is not None:
        available = min(available, limit)
    turns = prepare_turns(recent_turns)
    snips = prepare_items(snippets, "snippets")
    sums = prepare_items(summaries, "summaries")

    dedupe = _DuplicateFilter(budget.near_duplicate_jaccard)
    duplicates = 0
    for item in turns:  # turns are the conversation itself: never dropped as duplicates
        dedupe.is_new(item.text)
    kept_snips: list[ContextItem] = []
    kept_sums: list[tuple[int, ContextItem]] = []
    for item in snips:
        if dedupe.is_new(item.text):
            kept_snips.append(item)
        else:
            duplicates += 1
    for pos, item in enumerate(sums):
        if dedupe.is_new(item.text):
            kept_sums.append((pos, item))
        else:
            duplicates += 1

    over = 0
    # Snippets: best first, each one that fits.
    snippet_blocks: list[ContextBlock] = []
    used = 0
    for item in kept_snips:
        n = counter(item.prompt_text)
        if used + n <= budget.snippets:
            snippet_blocks.append(_block("snippets", item, item.prompt_text, n))
            used += n
        else:
            over += 1
    # Recent turns: newest first, contiguous.
    turn_blocks: list[ContextBlock] = []
    used = 0
    for i, item in reversed(list(enumerate(turns))):
        n = counter(item.prompt_text)
        if used + n <= budget.recent_turns:
            turn_blocks.append(_block("recent_turns", item, item.prompt_text, n))
            used += n
            continue
        dropped = i + 1  # this turn and every older one
        if not turn_blocks:  # the newest turn alone is too long: keep its end
            tail = _tail_to_fit(item.prompt_text, budget.recent_turns, counter)
            if tail is not None:
                turn_blocks.append(_block("recent_turns", item, tail, counter(tail), truncated=True))
                dropped -= 1
        over += dropped
        break
    turn_blocks.reverse()
    # Summaries: highest level first, newest first within a level, each one that fits.
    newest_first = sorted(
        kept_sums,
        key=lambda p: (p[1].level, p[1].created_at is None, p[1].created_at or datetime.min, p[0]),
        reverse=True,
    )
    summary_blocks: list[ContextBlock] = []
    used = 0
    for _pos, item in newest_first:
        n = counter(item.prompt_text)
        if used + n <= budget.summaries:
            summary_blocks.append(_block("summaries", item, item.prompt_text, n))
            used += n
        else:
            over += 1
    # Trimming order: lowest level first, oldest first within a level (the packing order reversed).
    keep_order = summary_blocks[::-1]
    # In the prompt: highest level first, oldest first within a level.
    summary_blocks = sorted(keep_order, key=lambda b: -(b.level or 1))  # stable: oldest first within a level

    # The total: trim snippets (worst first), then recent turns (oldest first), then summaries (lowest level first, oldest first within a level).
    def total() -> int:
        return sum(b.tokens for b in (*keep_order, *snippet_blocks, *turn_blocks))

    while total() > available:
        if snippet_blocks:
            snippet_blocks.pop()
        elif turn_blocks:
            turn_blocks.pop(0)
        else:
            summary_blocks.remove(keep_order.pop(0))
        over += 1
    offered = sum(1 for item in (*snips, *sums) if item.source in MEMORY_SOURCES)
    return AssembledContext(
        [*summary_blocks, *snippet_blocks, *turn_blocks], budget, available, duplicates, over, offered
    )


def _block(part: Part, item: ContextItem, text: str, tokens: int, *, truncated: bool = False) -> ContextBlock:
    return ContextBlock(
        part,
        text,
        tokens,
        item.source,
        item.role,
        item.created_at,
        item.score,
        item.provenance,
        truncated,
        item.level if part == "summaries" else None,
    )


__all__ = [
    "AssembledContext",
    "ContextBlock",
    "ContextItem",
    "MEMORY_SOURCES",
    "TokenCounter",
    "approx_token_count",
    "assemble_context",
    "prepare_items",
    "prepare_turns",
]


def check_context_inputs(
    recent_turns: Sequence[Turn],
    summaries: Sequence[str | ContextItem],
    budget: ContextBudget | None,
    counter: TokenCounter | None,
    max_tokens: int | None,
) -> tuple[list[ContextItem], list[ContextItem]]:
    """(turns, summaries) as items, every option checked: before a search, because a search may record
    access, and must not when assembly would fail."""
    check_assembly_options(budget, counter)
    check_max_tokens(max_tokens)
    return prepare_turns(recent_turns), prepare_items(summaries, "summaries")


def pack_search_result(
    result: SearchResult,
    recent_turns: Sequence[ContextItem],
    summaries: Sequence[ContextItem],
    *,
    budget: ContextBudget,
    counter: TokenCounter,
    max_tokens: int | None,
    active_digests: Sequence[ConsolidatedHit] = (),
) -> AssembledContext:
    """A search's context (a span `pack`, and the context metrics). Summaries: the caller's, the active
    digests and phase 3's digest hits (levels 2+), archived hits (level 1); snippets: phase 3's facts,
    then hot hits (assemble_context orders and trims by level)."""
    digests = {d.id: d for d in [*active_digests, *(h for h in result.consolidated if h.kind == "digest")]}
    facts = [ContextItem.from_consolidated(h) for h in result.consolidated if h.kind == "fact"]
    with span("pack") as s:
        ctx = assemble_context(
            summaries=[*summaries, *map(ContextItem.from_consolidated, digests.values()), *result.archived],
            recent_turns=recent_turns,
            snippets=[*facts, *result.hot],
            budget=budget,
            counter=counter,
            max_tokens=max_tokens,
        )
        if s.recording:
            s.set(
                {
                    "memory_archive.tokens.used": ctx.total_tokens,
                    "memory_archive.tokens.available": ctx.available,
                    "memory_archive.tokens.budget": ctx.budget.total,
                    "memory_archive.blocks": len(ctx.blocks),
                    "memory_archive.memories.offered": ctx.offered_memories,
                    "memory_archive.memories.injected": ctx.injected_memories,
                    "memory_archive.injected_ids": [
                        str(b.provenance.archive_id or b.provenance.memory_id)
                        for b in ctx.blocks
                        if b.provenance is not None
                    ],
                    "memory_archive.dropped.duplicates": ctx.dropped_duplicates,
                    "memory_archive.dropped.budget": ctx.dropped_for_budget,
                    "memory_archive.injection_hit_rate": ctx.injection_hit_rate,
                    "memory_archive.memory_token_share": ctx.memory_token_share,
                }
            )
    telemetry.record_context(ctx)
    return ctx
