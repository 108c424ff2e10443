"""When a new text is the same memory as a live one, and when it replaces one: the write path's rules.

`add` is add-only by default: every distinct memory stays live. A new text is merged into a live
memory of its user only when it restates it (`restatement`):

* **near-exact**: the same content words in the same order once case, punctuation, whitespace,
  articles and "user" are set aside ("User prefers cortado." / "the user prefers a cortado");
* **paraphrase**, semantic embedders only: cosine >= the embedder's calibrated `paraphrase` threshold
  AND the same names, numbers, dates, times and negations ("Ada flies to Oslo at 7:40 on 12 March" /
  "On 12 March Ada's flight to Oslo leaves at 7:40"). The hashing embedder has no paraphrase test:
  its cosine cannot tell a paraphrase from a changed object.

Any pair that differs in a name, number, date, time, place or object stays two memories: an event
("booked a hotel in Montreal" / "... in Reykjavik") is never a changed state, and no cosine or word
rule can tell the two apart. A new text replaces (supersedes) a live memory only when that is known:
`update()`, `add(..., supersedes=id)`, an LLM judge (memory_lib.write.write_judge), or the opt-in state
rule below (`state_change`, WriteConfig.state_rule, off by default: it looks at the user's closest
live memories, whatever their cosine, and needs the same subject and state predicate).

Thresholds per embedder were measured on bench/data/write_pairs.jsonl (pairs written for this
project) by `python -m bench write_path`; OpenAI's could not be measured here (no API access) and stay
conservative. RetrievalConfig.near_duplicate_threshold / near_duplicate_floor override them.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from dataclasses import dataclass

# --------------------------------------------------------------------------- content words

_WORD = re.compile(r"[^\W_]+(?:[.,:/'’-][^\W_]+)*")
# Function words: differences in these alone do not change a fact for the lexical diff below.
# Negations are NOT here: "likes" -> "does not like" is a changed value.
_FUNCTION_WORDS = frozenset(
    str.split(
        "a an the and or but of to in on at by for with from as is are was were be been being am it its "
        "this that these those he she they them his her their we our you your i me my s do does did has "
        "have had so than then there here about into also just very can will would should could user users"
    )
)
_POSSESSIVE = re.compile(r"['’]s$")


def _words(text: str) -> list[str]:
    normalized = " ".join(unicodedata.normalize("NFKC", text).split())
    return [_POSSESSIVE.sub("", w) for w in _WORD.findall(normalized.casefold())]


def content_words(text: str) -> list[str]:
    """Casefolded words in order, without function words ("user's" counts as "user"); numbers keep
    their punctuation (4,417)."""
    return [w for w in _words(text) if w not in _FUNCTION_WORDS]


@dataclass(frozen=True)
class LexicalChange:
    """What differs between two texts' content words (reported in supersede events and results)."""

    removed: tuple[str, ...]  # content words of the old text that the new one drops
    added: tuple[str, ...]  # content words the new text brings

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.added)


def lexical_change(old: str, new: str) -> LexicalChange:
    """The content words one text drops and the other brings, in order."""
    a, b = content_words(old), content_words(new)
    removed: list[str] = []
    added: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            removed.extend(a[i1:i2])
            added.extend(b[j1:j2])
    return LexicalChange(tuple(removed), tuple(added))


# --------------------------------------------------------------------------- restatements

# Words a restatement may add or drop: articles, "user", fillers. Prepositions and auxiliaries are
# NOT here: "flight to Oslo" / "flight from Oslo", "is vegetarian" / "was vegetarian" differ.
_IGNORABLE = frozenset(str.split("a an the user users also just really very and & s"))
_NEGATIONS = frozenset(
    str.split("not no never n't none nobody nothing nowhere neither nor without cannot dont doesnt didnt")
)
_CALENDAR = frozenset(
    str.split(
        "january february march april may june july august september october november december jan feb mar apr "
        "jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday mon tue wed thu "
        "fri sat sun today tomorrow yesterday tonight morning afternoon evening night noon midnight weekend "
        "day days week weeks month months year years hour hours soon later earlier ago recently"
    )
)
_TOKEN = re.compile(r"[^\W_]+(?:['’.:,/-][^\W_]+)*|n['’]t\b")


# People by their relation are names too: "my nephew" / "my cousin" are two people.
_RELATIONS = frozenset(
    str.split(
        "mother father mom dad mum parent parents son daughter child children kid kids brother sister sibling "
        "uncle aunt nephew niece cousin grandfather grandmother grandpa grandma grandson granddaughter wife "
        "husband partner boyfriend girlfriend fiance fiancee boss manager colleague coworker friend neighbor "
        "neighbour teacher doctor dentist"
    )
)
# Words whose change turns a close paraphrase into another statement: direction, order in time, tense.
_GUARDED = frozenset(
    str.split("to from before after since until was were will used more less fewer first last next previous")
)


def _restatement_words(text: str) -> list[str]:
    return [w for w in _words(text) if w not in _IGNORABLE]


def _tokens(text: str) -> list[tuple[str, str]]:
    """(token as written, normalized word): casefolded, no possessive, every negation as "not"."""
    out = []
    for token in _TOKEN.findall(unicodedata.normalize("NFKC", text)):
        word = _POSSESSIVE.sub("", token.casefold()).replace("’", "'")
        out.append((token, "not" if word.endswith("n't") or word in _NEGATIONS else word))
    return out


def salient_tokens(text: str) -> frozenset[str]:
    """What a restatement must keep: numbers (any token with a digit), names (capitalized words that
    are not function words), people by relation, calendar words, negations ("not"); casefolded."""
    return frozenset(
        word
        for token, word in _tokens(text)
        if word == "not"
        or word in _CALENDAR
        or word in _RELATIONS
        or any(c.isdigit() for c in word)
        or (token[:1].isupper() and word not in _FUNCTION_WORDS and word not in _IGNORABLE)
    )


def _names_in_order(text: str) -> list[str]:
    """The names (capitalized salient words) in order of first appearance."""
    names: list[str] = []
    for token, word in _tokens(text):
        if (
            token[:1].isupper()
            and word not in names
            and word != "not"
            and word not in _CALENDAR
            and word not in _RELATIONS
            and word not in _FUNCTION_WORDS
            and word not in _IGNORABLE
            and not any(c.isdigit() for c in word)
        ):
            names.append(word)
    return names


@dataclass(frozen=True)
class Thresholds:
    """An embedder's calibrated cosines (see the module docstring)."""

    paraphrase: (
        float | None
    )  # cosine from which a text with the same salient tokens restates a memory; None: off
    floor: float  # cosine from which a live memory is a candidate for the LLM judge


# Measured by `python -m bench write_path` on bench/data/write_pairs.jsonl (docs: the write path): each
# stays above the highest cosine of a distinct pair that passes the word checks (MiniLM: 0.92, "sent the
# draft to my editor / co-author"), so no distinct pair of the set merges.
THRESHOLDS: dict[str, Thresholds] = {
    "hashing": Thresholds(paraphrase=None, floor=0.25),
    "minilm": Thresholds(paraphrase=0.95, floor=0.55),
    "openai": Thresholds(paraphrase=0.95, floor=0.55),  # not measured here: no API access
    "semantic": Thresholds(paraphrase=0.97, floor=0.60),  # any other semantic model: conservative
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
    model: str, kind: str | None, *, paraphrase: float | None = None, floor: float | None = None
) -> Thresholds:
    """The embedder's calibrated thresholds, with the configured overrides (None: calibrated)."""
    base = THRESHOLDS[embedder_family(model, kind)]
    return Thresholds(
        base.paraphrase if paraphrase is None else paraphrase, base.floor if floor is None else floor
    )


def restatement(similarity: float, old: str, new: str, thresholds: Thresholds) -> bool:
    """True when `new` restates `old` (module docstring): merging them loses nothing."""
    salient = salient_tokens(old) | salient_tokens(new)  # a name capitalized in one text only still counts
    if {w for _, w in _tokens(old) if w in salient} != {w for _, w in _tokens(new) if w in salient}:
        return False
    a, b = _restatement_words(old), _restatement_words(new)
    if a == b:
        return True
    if thresholds.paraphrase is None or similarity < thresholds.paraphrase:
        return False
    if sorted(a) == sorted(b):  # the same words in another order: who did what to whom may differ
        return False
    if _names_in_order(old) != _names_in_order(new):  # "Joanna: see ya Nate" / "Nate: see you later Joanna"
        return False
    return _GUARDED.intersection(a) == _GUARDED.intersection(b)


# --------------------------------------------------------------------------- the opt-in state rule

# A state predicate: a subject has one value of it at a time, so a new value replaces the old one.
# Each entry: the predicate's name and the phrasings that state it (the value follows).
_STATE_PREDICATES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("residence", ("lives in", "is living in", "moved to", "relocated to", "now lives in", "lives at")),
    (
        "employer",
        (
            "works at",
            "works for",
            "is working at",
            "is working for",
            "joined",
            "is employed at",
            "is employed by",
            "started working at",
            "started a new job at",
        ),
    ),
    ("job", ("works as", "is working as", "job is", "role is", "job title is")),
    ("preference", ("prefers", "now prefers", "switched to")),
    ("allergy", ("is allergic to",)),
    ("car", ("drives a", "drives an", "car is a", "car is an")),
    ("phone", ("phone number is", "phone is", "number is")),
    ("email", ("email is", "email address is")),
    ("partner", ("is married to", "is dating", "partner is", "is engaged to")),
    ("timezone", ("timezone is", "time zone is")),
    ("school", ("studies at", "is studying at", "goes to school at")),
    ("manager", ("reports to", "manager is", "boss is")),
    ("diet", ("is vegetarian", "is vegan", "is pescatarian", "eats meat", "is on a diet")),
)
_FAVORITE = re.compile(r"^(?P<subject>.*?)\bfavou?rite (?P<what>[\w ]+?) is (?P<value>.+)$")
_TRAILING = re.compile(r"\b(?:now|these days|nowadays|anymore|again|instead|as of (?:today|now)|lately)$")
_SUBJECT_ALIASES = {"": "", "user": "", "the user": "", "i": "", "i'm": "", "i am": ""}


@dataclass(frozen=True)
class StateFact:
    subject: str
    predicate: str
    value: str


def _clean(text: str) -> str:
    text = " ".join(unicodedata.normalize("NFKC", text).casefold().replace("’", "'").split())
    return text.strip(" .!?;")


def state_fact(text: str) -> StateFact | None:
    """The text as "<subject> <state predicate> <value>", or None when it states no known state."""
    t = _clean(text)
    m = _FAVORITE.match(t)
    if m:
        subject, predicate, value = m["subject"], f"favorite {m['what'].strip()}", m["value"]
    else:
        found = None
        for name, phrases in _STATE_PREDICATES:
            for phrase in phrases:
                hit = re.search(rf"(?:^|\s){re.escape(phrase)}(?:\s|$)", t)
                if hit and (found is None or hit.start() < found[2]):
                    found = (name, phrase, hit.start(), hit.end())
        if found is None:
            return None
        name, phrase, start, end = found
        subject, predicate, value = t[:start], name, t[end:]
        if name == "diet":
            value = phrase  # the phrase is the value: "is vegetarian" -> "eats meat"
    subject = re.sub(r"\b(?:now|has|have|recently|just|also)\b", " ", subject)
    subject = " ".join(subject.replace("'s", "").split())
    subject = _SUBJECT_ALIASES.get(subject, subject)
    value = _TRAILING.sub("", " ".join(value.split())).strip(" ,.")
    value = re.sub(r"^(?:a|an|the)\s+", "", value)
    if not value:
        return None
    return StateFact(subject, predicate, value)


def state_change(old: str, new: str) -> StateFact | None:
    """The state fact `new` changes in `old`: the same subject and state predicate with another value
    ("Lives in Lisbon" -> "Moved to Porto"). None otherwise. Opt-in (WriteConfig.state_rule)."""
    a, b = state_fact(old), state_fact(new)
    if a is None or b is None or (a.subject, a.predicate) != (b.subject, b.predicate) or a.value == b.value:
        return None
    return b
