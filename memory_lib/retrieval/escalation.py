"""When search escalates past phases 1-2, and to what.

After phases 1-2 (memory_lib.retrieval.search) an evaluator decides one of four actions:

* ``return``: the hits are enough;
* ``search_warm``: search the archived summaries again (phase 2 forced), with a refined query if given;
* ``search_cold``: phase 3, digests and facts (memory_lib.retrieval.consolidated);
* ``search_facts``: phase 3, facts only ("who is Sarah?").

Evaluators:

* `HeuristicEvaluator` ("heuristic-offline"), the DEFAULT: no network. It escalates when the query asks
  about history (a time before the hot horizon, "last year", "how did I handle…", "last time", "used
  to") or about a person ("who is X?"), or when phases 1-2 are weak: no hit at all, or no hit that
  shares a query term (full-text match) and none that nearly restates the query (cosine >=
  RetrievalConfig.strong_hot_similarity, the cut phase 2 uses).
* `LLMEvaluator` ("anthropic:<model>" / "openai:<model>"): an evaluation prompt over an LLM client
  (memory_lib.llm.client), the JSON decision validated by pydantic (`EscalationDecision`). Opt-in
  (RetrievalConfig.phase3_evaluator = "llm", or pass it to the client). A failed call or malformed JSON falls back to the heuristic, and
  the result says so (`Escalation.fallback`).

Every search result carries an `Escalation`: the evaluator, the action, why, the refined query, and
the tiers actually searched. Phase 1 strong enough to skip phase 2 is also strong enough to return
without asking an evaluator (the "quick check").

`escalated_search` is the one control flow for both clients: a flow (memory_lib.core.plans) yielding
`RunPlan` steps and `Call` steps (embedding a refined query, asking the evaluator), run by
`core.plans.drive` (sync) or `drive_async`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.errors import InvalidInputError, MemoryArchiveError
from ..core.plans import Call, Flow, RunPlan
from ..core.timescope import TimeWindow, parse_time_window
from ..core.validation import MAX_QUERY_CHARS
from ..llm.client import LLMClient, llm_client_from_settings
from ..llm.transport import strip_json_fence
from ..observability.trace import span
from .associations import search_with_links_plan
from .consolidated import ConsolidatedHit, consolidated_plan
from .ranking import cut, sort_hits
from .search import search_plan
from .types import SearchHit, SearchRequest, SearchResult, merge_debug

if TYPE_CHECKING:
    from ..core.config import LLMConfig

__all__ = [
    "EVALUATION_PROMPT",
    "Escalation",
    "EscalationDecision",
    "EvaluationInput",
    "HeuristicEvaluator",
    "LLMEvaluator",
    "Phase3Mode",
    "escalated_search",
    "evaluator_from_settings",
]

Action = Literal["return", "search_warm", "search_cold", "search_facts"]
Phase3Mode = Literal["auto", "always", "never"]
HEURISTIC = "heuristic-offline"


class EscalationDecision(BaseModel):
    """The evaluator's JSON decision. `sufficient: true` means return, whatever `action` says."""

    model_config = ConfigDict(extra="ignore", strict=True)

    sufficient: bool
    reason: str = Field(min_length=1, max_length=1000)
    action: Action
    refinedQuery: str | None = Field(None, max_length=MAX_QUERY_CHARS)  # noqa: N815 - the prompt's JSON key

    @property
    def effective_action(self) -> Action:
        return "return" if self.sufficient else self.action

    @property
    def refined_query(self) -> str | None:
        q = (self.refinedQuery or "").strip()
        return q or None


@dataclass(frozen=True)
class Escalation:
    """What was decided after phases 1-2, by whom, why, and which tiers were searched in the end."""

    mode: Phase3Mode
    # "heuristic-offline", "anthropic:<model>", "openai:<model>"; "caller" (phase3 never/always), or
    # "quick-check" (phase 1 strong: no evaluator asked)
    evaluator: str
    action: Action
    reason: str
    refined_query: str | None
    tiers_searched: tuple[str, ...]  # among "hot", "archived", "digests", "facts"
    fallback: str | None = None  # why an LLM's decision was not used (the heuristic decided instead)


@dataclass(frozen=True)
class EvaluationInput:
    query: str
    hits: Sequence[SearchHit]
    window: TimeWindow | None
    request: SearchRequest


# --------------------------------------------------------------------------- heuristic

_WHO = re.compile(r"\bwho(?:'s|\s+is|\s+was|\s+are|\s+were)\s+(.+?)\s*[?.!]*$", re.IGNORECASE)
_HISTORY = re.compile(
    r"\b(?:how\s+did\s+(?:i|we)\s+(?:handle|deal|cope|manage|solve|fix|get)|last\s+time|used\s+to|remember\s+when|"
    r"back\s+when|in\s+the\s+past|over\s+the\s+years|years?\s+ago|months\s+ago|history\s+of|ever\s+since)\b",
    re.IGNORECASE,
)


class HeuristicEvaluator:
    """Offline, deterministic: history cues and weak phase 1-2 hits escalate (module docstring)."""

    name = HEURISTIC

    def evaluate(self, item: EvaluationInput) -> EscalationDecision:
        q, hits, cfg = item.query, item.hits, item.request.config
        if m := _WHO.search(q.strip()):
            return _decide("search_facts", f"asks who someone is ({m.group(1)!r}): facts first", m.group(1))
        horizon = item.request.now - timedelta(days=cfg.hot_horizon_days)
        if item.window is not None and item.window.since < horizon:
            return _decide("search_cold", f"names a time before the hot horizon ({item.window.phrase!r})")
        if m := _HISTORY.search(q):
            return _decide("search_cold", f"asks about history ({m.group(0)!r})")
        if not hits:
            return _decide("search_cold", "phases 1-2 found nothing")
        best = max(h.scores.similarity for h in hits)
        if not any(h.scores.text_rank is not None for h in hits) and best < cfg.strong_hot_similarity:
            return _decide(
                "search_cold",
                f"weak hits: none shares a query term, best cosine {best:.2f} "
                f"< strong_hot_similarity {cfg.strong_hot_similarity}",
            )
        matched = sum(h.scores.text_rank is not None for h in hits)
        return EscalationDecision(
            sufficient=True,
            action="return",
            reason=f"{len(hits)} hits, {matched} sharing a query term, best cosine {best:.2f}",
        )


def _decide(action: Action, reason: str, refined: str | None = None) -> EscalationDecision:
    return EscalationDecision(sufficient=False, action=action, reason=reason, refinedQuery=refined)


# --------------------------------------------------------------------------- LLM

EVALUATION_PROMPT = """You are evaluating memory search results.

Query: "{query}"
Results found: {count}
Top scores: {scores}
Result summaries:
{summaries}

Evaluate:
1. Do these results directly answer or provide context for the query?
2. Is there an implied need for older/historical information?
3. Are the similarity scores confident (>0.7) or uncertain (<0.5)?
4. Does this query reference a specific person, project, or event that might have deeper history?

Respond with JSON:
{{
  "sufficient": true/false,
  "reason": "Brief explanation",
  "action": "return" | "search_warm" | "search_cold" | "search_facts",
  "refinedQuery": "Optional refined search query for deeper search"
}}"""


def render_evaluation_prompt(item: EvaluationInput, max_results: int = 5) -> str:
    top = item.hits[:max_results]
    return EVALUATION_PROMPT.format(
        query=item.query.replace('"', "'"),
        count=len(item.hits),
        scores=", ".join(f"{h.scores.similarity:.2f}" for h in top) or "none",
        summaries="\n".join(f"- [{h.source}] {' '.join(h.text.split())[:200]}" for h in top) or "- (none)",
    )


def parse_decision(text: str) -> EscalationDecision:
    """The JSON object in `text` (code fences tolerated), validated; ValueError when there is none."""
    body = strip_json_fence(text)
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        raise ValueError(f"no JSON object in the evaluator's answer: {text[:80]!r}")
    return EscalationDecision.model_validate(json.loads(body[start : end + 1]))


class LLMEvaluator:
    """The evaluation prompt over an LLM client (Anthropic or OpenAI); only the prompt and the parsing
    are ours. Falls back to `fallback` (the heuristic) when the call fails or the answer is malformed."""

    def __init__(
        self, llm: LLMClient, *, max_output_tokens: int = 300, fallback: HeuristicEvaluator | None = None
    ):
        self.llm = llm
        self.kind = llm.kind
        self.model = llm.model
        self.name = f"{self.kind}:{self.model}"
        self.max_output_tokens = max_output_tokens
        self.fallback = fallback or HeuristicEvaluator()

    def __repr__(self) -> str:  # never the key
        return f"LLMEvaluator({self.name!r})"

    def complete(self, prompt: str) -> str:
        # "summary": the request's name in error messages, as for every JSON prompt.
        return self.llm.complete(prompt, max_tokens=self.max_output_tokens, what="summary").text or ""

    def decide(self, item: EvaluationInput) -> tuple[EscalationDecision, str, str | None]:
        """(decision, who decided, fallback reason): the heuristic decides when the LLM cannot."""
        try:
            text = self.complete(render_evaluation_prompt(item))
        except MemoryArchiveError as exc:
            return self.fallback.evaluate(item), self.fallback.name, f"{self.name} call failed: {exc}"
        try:
            return parse_decision(text), self.name, None
        except (ValueError, ValidationError) as exc:
            detail = " ".join(str(exc).split())[:200]
            return (
                self.fallback.evaluate(item),
                self.fallback.name,
                f"{self.name} answered malformed JSON: {detail}",
            )


Evaluator = HeuristicEvaluator | LLMEvaluator


def decide(evaluator: Evaluator, item: EvaluationInput) -> tuple[EscalationDecision, str, str | None]:
    if isinstance(evaluator, LLMEvaluator):
        return evaluator.decide(item)
    return evaluator.evaluate(item), evaluator.name, None


def evaluator_from_settings(kind: str, llm: LLMConfig) -> Evaluator:
    """RetrievalConfig.phase3_evaluator: "heuristic" (default, offline) or "llm" (settings.llm's provider;
    "auto" picks Anthropic, then OpenAI, by which key is set; no key is an error, not a silent heuristic)."""
    if kind == "heuristic":
        return HeuristicEvaluator()
    if kind != "llm":
        raise InvalidInputError("retrieval.phase3_evaluator", kind, "must be 'heuristic' or 'llm'")
    try:
        client = llm_client_from_settings(
            llm, max_retries=min(llm.max_retries, 2), timeout=min(llm.timeout_seconds, 15.0)
        )
    except InvalidInputError:
        client = None  # the provider named has no key: the same error as no provider
    if client is None:
        raise InvalidInputError(
            "retrieval.phase3_evaluator",
            kind,
            "'llm' needs ANTHROPIC_API_KEY or OPENAI_API_KEY (and llm.provider not 'extractive')",
        )
    return LLMEvaluator(client)


# --------------------------------------------------------------------------- the flow


def _tiers(result: SearchResult) -> list[str]:
    return ["hot", *(["archived"] if result.phase2_reason is not None else [])]


def escalated_search(
    request: SearchRequest,
    mode: Phase3Mode,
    *,
    evaluator: Evaluator,
    embed: Callable[[str], Any],
    follow_links: bool = False,
) -> Flow[SearchResult]:
    """Phases 1-2 (and the archived memories their hot hits link to, follow_links), the decision, then
    at most one escalation. Returns the result with `escalation` set. `embed` (a refined query) and the
    evaluator are blocking calls (`Call` steps)."""
    if mode not in ("auto", "always", "never"):
        raise InvalidInputError("phase3", mode, "must be 'auto', 'always' or 'never'")
    result: SearchResult = yield RunPlan(search_with_links_plan(request, follow_links=follow_links))
    tiers = _tiers(result)
    window = parse_time_window(request.query, request.now)
    fallback: str | None = None
    if mode == "never":
        decision, who = _decide("return", "phase3='never'"), "caller"
    elif mode == "always":
        decision, who = _decide("search_cold", "phase3='always'"), "caller"
    elif result.phase2_reason is None and result.hits:
        decision = EscalationDecision(
            sufficient=True,
            action="return",
            reason="phase 1 strong: enough hot hits nearly restate the query",
        )
        who = "quick-check"
    else:
        item = EvaluationInput(request.query, result.hits, window, request)
        decision, who, fallback = yield Call(partial(decide, evaluator, item))
    action, refined = decision.effective_action, decision.refined_query
    query = refined or request.query
    consolidated: list[ConsolidatedHit] = []
    if action != "return":
        embedding = request.embedding if query == request.query else (yield Call(partial(embed, query)))
        total = request.limits[0]
        if action == "search_warm":
            again: SearchResult = yield RunPlan(
                search_plan(replace(request, query=query, embedding=embedding, phase2="always"))
            )
            result = replace(
                result,
                hits=_merge(result.hits, again.hits, request),
                debug=merge_debug(result.debug, again.debug),
            )
            tiers = sorted({*tiers, "hot", "archived"}, key=["hot", "archived"].index)
        else:
            kinds: tuple[Literal["digest", "fact"], ...] = (
                ("fact",) if action == "search_facts" else ("digest", "fact")
            )
            names = ["digests", "facts"] if len(kinds) == 2 else ["facts"]
            with span(
                "retrieve",
                {
                    "memory_archive.phase": "3",
                    "memory_archive.tiers": names,
                    "memory_archive.phase3.action": action,
                    "memory_archive.phase3.evaluator": who,
                    "memory_archive.phase3.refined_query": refined is not None,
                },
            ) as s:
                consolidated = yield RunPlan(
                    consolidated_plan(
                        request.user_id,
                        query,
                        embedding,
                        kinds=kinds,
                        limit=total,
                        window=window or parse_time_window(query, request.now),
                        embedding_model=request.embedding_model,
                    )
                )
                s.set({"memory_archive.candidates.consolidated": len(consolidated)})
            tiers += names
    escalation = Escalation(mode, who, action, decision.reason, refined, tuple(tiers), fallback)
    return replace(result, consolidated=consolidated, escalation=escalation)


def _merge(
    first: Sequence[SearchHit], second: Sequence[SearchHit], request: SearchRequest
) -> list[SearchHit]:
    best: dict[Any, SearchHit] = {}
    for hit in (*first, *second):
        key = hit.provenance.memory_id
        if key not in best or hit.scores.final > best[key].scores.final:
            best[key] = hit
    total, hot_cap, archived_cap = request.limits
    return cut(sort_hits(list(best.values())), total, hot_cap, archived_cap)
