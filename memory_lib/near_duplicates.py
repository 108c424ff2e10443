"""When a new text is the same fact as a live memory (seed 004 "Dedup/canonicalize"), per embedder.

Cosine scales differ by embedder (the hashing embedder scores "prefers a cortado" / "prefers a flat
white" 0.46, all-MiniLM-L6-v2 0.63; a fixed 0.92 merges neither), so one constant cannot serve them
all. The rule, for the nearest live memory of the user:

* **vector test**: cosine >= `vector` (the embedder's threshold) -> the same fact;
* **lexical test**, backing it: cosine >= `floor` and the content words of both texts differ in ONE
  contiguous slot after the first word, with at least half of the old text's content words kept
  around it ("prefers a cortado in the morning" -> "prefers a flat white in the morning") -> the same
  fact with a new value;
* but never when only the first word(s) differ ("order 4471 refund requested" -> "order 4147 refund
  requested", "Ana's birthday is on 3 May" -> "Rui's ..."): the same statement about another subject.

The same fact is then merged when no content word differs (only case, punctuation or function words),
and superseded otherwise (write_path). Anything else is a new memory.

Thresholds per embedder (THRESHOLDS) were measured on bench/near_duplicate_pairs.py (paraphrase,
changed value, related and unrelated pairs written for this project) by `python -m bench.near_duplicates`;
OpenAI's could not be measured here (no API access): they follow its published cosine scale and stay
conservative. RetrievalConfig.near_duplicate_threshold / near_duplicate_floor override them.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

# --------------------------------------------------------------------------- content words

_WORD = re.compile(r"[^\W_]+(?:[.,:/'’-][^\W_]+)*")
# Function words: differences in these alone do not change a fact. Negations are NOT here:
# "likes" -> "does not like" is a changed value.
_FUNCTION_WORDS = frozenset(
    str.split(
        "a an the and or but of to in on at by for with from as is are was were be been being am it its "
        "this that these those he she they them his her their we our you your i me my s do does did has "
        "have had so than then there here about into also just very can will would should could user users"
    )
)


_POSSESSIVE = re.compile(r"['’]s$")


def content_words(text: str) -> list[str]:
    """Casefolded words in order, without function words ("user's" counts as "user"); numbers keep
    their punctuation (4,417)."""
    normalized = " ".join(unicodedata.normalize("NFKC", text).split())
    words = (_POSSESSIVE.sub("", w) for w in _WORD.findall(normalized.casefold()))
    return [w for w in words if w not in _FUNCTION_WORDS]


@dataclass(frozen=True)
class LexicalChange:
    removed: tuple[str, ...]  # content words of the old text that the new one drops
    added: tuple[str, ...]  # content words the new text brings
    slots: int = 0  # contiguous places where the texts differ
    kept: int = 0  # content words both texts share, in order
    old_words: int = 0  # content words of the old text
    at_start: bool = False  # the first difference is at the first content word of both texts

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.added)

    @property
    def one_slot(self) -> bool:
        """One place differs, after the first word, and at least half of the old text's words frame it:
        a value replaced ("prefers a cortado" -> "prefers a flat white")."""
        return self.slots == 1 and not self.at_start and self.kept >= 1 and 2 * self.kept >= self.old_words

    @property
    def other_subject(self) -> bool:
        """Only the first word(s) differ: the same statement about another subject ("order 4471 refund
        requested" -> "order 4147 ..." is the same frame, "Ana's birthday" -> "Rui's birthday" too):
        two facts, whatever the cosine. Needs a frame of two words or more."""
        return self.slots == 1 and self.at_start and self.kept >= 2 and 2 * self.kept >= self.old_words


def lexical_change(old: str, new: str) -> LexicalChange:
    """What differs in content words, in order: any difference means a changed value."""
    a, b = content_words(old), content_words(new)
    removed: list[str] = []
    added: list[str] = []
    slots = kept = 0
    at_start = False
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            kept += i2 - i1
            continue
        at_start = at_start or (slots == 0 and i1 == 0 and j1 == 0)
        slots += 1
        removed.extend(a[i1:i2])
        added.extend(b[j1:j2])
    return LexicalChange(tuple(removed), tuple(added), slots, kept, len(a), at_start)


# --------------------------------------------------------------------------- thresholds


@dataclass(frozen=True)
class Thresholds:
    vector: float  # cosine at or above which two texts are the same fact
    floor: float  # cosine at or above which the lexical test may decide


# Measured on bench/near_duplicate_pairs.py (48 pairs; README "Write path" has the table). Both keep a
# margin above the related pairs' cosines for the vector test and let the lexical test take the changed
# values below it: hashing 39/48 right (2 related pairs taken as one fact; the grid's 0.40/0.40 scores
# 41/48 with a vector test at a cosine templated texts reach), MiniLM 43/48 (2; the grid's 0.65/0.60
# scores 44/48 with 0.02 of margin over a related pair). The 2 are "brother lives / works in Berlin"
# and "invoice 2291 / 2297 was paid": one changed word after the subject, which no cosine separates.
THRESHOLDS: dict[str, Thresholds] = {
    "hashing": Thresholds(vector=0.65, floor=0.40),
    "minilm": Thresholds(vector=0.80, floor=0.55),
    "openai": Thresholds(vector=0.85, floor=0.55),  # not measured here: no API access
    "semantic": Thresholds(vector=0.92, floor=0.60),  # any other semantic model: the former constant
}


def embedder_family(model: str, kind: str | None) -> str:
    """Which calibrated family an embedder (its model name and kind) belongs to."""
    if model.startswith("hashing-lexical") or kind == "lexical":
        return "hashing"
    if model == "all-MiniLM-L6-v2":
        return "minilm"
    if model.startswith("text-embedding-"):
        return "openai"
    return "semantic"


def thresholds_for(
    model: str, kind: str | None, *, vector: float | None = None, floor: float | None = None
) -> Thresholds:
    """The embedder's calibrated thresholds, with the configured overrides (None: calibrated)."""
    base = THRESHOLDS[embedder_family(model, kind)]
    return Thresholds(base.vector if vector is None else vector, base.floor if floor is None else floor)


Decision = Literal["new", "merge", "supersede"]


def decide(similarity: float, old: str, new: str, thresholds: Thresholds) -> tuple[Decision, LexicalChange]:
    """new: another fact; merge: the same words; supersede: the same fact with a changed value."""
    change = lexical_change(old, new)
    same = not change.other_subject and (
        similarity >= thresholds.vector or (similarity >= thresholds.floor and change.one_slot)
    )
    if not same:
        return "new", change
    return ("supersede" if change.changed else "merge"), change
