"""The write judge: an LLM decides whether a new text is new, or duplicates, updates or contradicts one of
the user's closest live memories (WriteConfig.judge; memory_lib.write.write_path applies the verdict).

Invariants:
* the judge never raises and never blocks a write: a failed call, an answer that is not one JSON object
  valid under `JudgeAnswer`, or a target that is not one of the memories shown gives a failed verdict,
  and the memory is added (add-only);
* it is asked only when a live memory is at least as close as the embedder's candidate floor and none
  restates the new text (the restatement rule merges those without a call);
* every answer that arrived is billed in the ledger (llm_usage, purpose 'write_judge'), in the add's
  own transaction, with the decision in the memory's audit event.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..core.errors import InvalidInputError
from ..llm.client import llm_client_from_settings
from ..llm.json_answers import JsonLLM, JsonUsage, parse_json_object

if TYPE_CHECKING:
    from ..core.config import LLMConfig, WriteConfig

__all__ = [
    "JUDGE_MARKER",
    "Candidate",
    "JudgeAnswer",
    "LLMWriteJudge",
    "Verdict",
    "judge_prompt",
    "write_judge_from_settings",
]

JUDGE_MARKER = "You decide how a new memory relates to the memories a user already has."
Decision = Literal["new", "duplicate", "updates", "contradicts"]


class JudgeAnswer(BaseModel):
    """The answer the judge must give: one JSON object."""

    model_config = ConfigDict(extra="ignore")

    decision: Decision
    target: int | None = Field(None, ge=1, description="The stored memory's number; null for 'new'.")
    reason: str = Field("", max_length=500)

    @model_validator(mode="after")
    def _target_when_related(self) -> JudgeAnswer:
        if self.decision != "new" and self.target is None:
            raise ValueError(f"decision {self.decision!r} needs the number of the stored memory in 'target'")
        return self


@dataclass(frozen=True)
class Candidate:
    """A live memory close to the new text, as shown to the judge."""

    id: uuid.UUID
    content: str
    similarity: float


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    target: uuid.UUID | None
    reason: str
    model: str
    provider: str
    usage: JsonUsage | None  # None: no answer arrived (nothing was billed)
    error: str | None = None  # the judge failed: the memory is added

    @property
    def failed(self) -> bool:
        return self.error is not None

    def details(self) -> dict[str, object]:
        """What the audit event keeps of the decision."""
        out: dict[str, object] = {"decision": self.decision, "model": self.model}
        if self.target is not None:
            out["target"] = str(self.target)
        if self.reason:
            out["reason"] = self.reason[:200]
        if self.error is not None:
            out["error"] = self.error[:200]
        return out


def judge_prompt(new_text: str, candidates: Sequence[Candidate]) -> str:
    stored = "\n".join(f"[{i}] <stored>{c.content}</stored>" for i, c in enumerate(candidates, 1))
    return (
        f"{JUDGE_MARKER}\n\n"
        f"Stored memories, closest first:\n{stored}\n\n"
        "Answer with one JSON object and nothing else: "
        '{"decision": "new" | "duplicate" | "updates" | "contradicts", "target": <number of the stored memory, '
        'or null for new>, "reason": "<a few words>"}\n'
        '- "duplicate": it says the same thing as stored memory N: the same people, places, numbers, dates.\n'
        '- "updates": it replaces N: the same attribute of the same subject now has another value '
        "(moved to another city, a new employer, a changed preference).\n"
        '- "contradicts": it says N is not true (any more).\n'
        '- "new": anything else, including another event of the same kind (another meeting, booking, trip, '
        "purchase or task) and a memory that differs from N in a name, number, date, place or object without "
        'replacing it. When unsure, answer "new".\n\n'
        f"New memory:\n<memory>{new_text}</memory>"
    )


class LLMWriteJudge:
    """The judge prompt over the configured provider (Anthropic or OpenAI), through JsonLLM."""

    def __init__(self, llm: JsonLLM):
        self._llm = llm
        self.model = llm.model
        self.kind = llm.kind

    def __repr__(self) -> str:
        return f"LLMWriteJudge({self.kind}, model={self.model!r})"

    def judge(self, new_text: str, candidates: Sequence[Candidate]) -> Verdict:
        """The verdict on `new_text` against `candidates` (non-empty). Never raises (module docstring)."""
        usage: JsonUsage | None = None
        try:
            text, usage = self._llm.complete_text(judge_prompt(new_text, candidates))
            answer = parse_json_object(text, JudgeAnswer, model=self.model)
            target = None
            if answer.decision != "new":
                if answer.target is None or answer.target > len(candidates):
                    raise ValueError(
                        f"target {answer.target} is not one of the {len(candidates)} stored memories"
                    )
                target = candidates[answer.target - 1].id
        except Exception as exc:  # noqa: BLE001 - any failure of the judge adds the memory
            return Verdict(
                "new", None, "", self.model, self.kind, usage, error=f"{type(exc).__name__}: {exc}"
            )
        return Verdict(
            answer.decision, target, answer.reason, usage.model if usage else self.model, self.kind, usage
        )


def write_judge_from_settings(write: WriteConfig, llm: LLMConfig) -> LLMWriteJudge | None:
    """WriteConfig.judge: 'off' -> None; 'auto' -> the LLM when a key is set (llm.provider not 'extractive');
    'llm' -> the LLM, and no key is an error naming the setting. One retry at most and a short timeout:
    the judge runs inside `add`."""
    if write.judge == "off":
        return None
    try:
        client = llm_client_from_settings(
            llm, max_retries=min(llm.max_retries, 1), timeout=min(llm.timeout_seconds, 10.0)
        )
    except InvalidInputError:
        if write.judge == "llm":
            raise
        return None  # 'auto' with llm.provider naming a provider whose key is unset: no judge
    if client is not None:
        return LLMWriteJudge(JsonLLM(client, max_output_tokens=200))
    if write.judge == "llm":
        raise InvalidInputError(
            "write.judge",
            write.judge,
            "'llm' needs ANTHROPIC_API_KEY or OPENAI_API_KEY (and llm.provider not 'extractive')",
        )
    return None
