"""The offline extractive summarizer ("extractive-offline"): no LLM, no network, deterministic.

It keeps what makes a memory findable (its most informative sentences, and every name, number, date
and content word of the rest), and the archive takes a memory's entities from `extract_key_entities`.
"""

from __future__ import annotations

import re

from ..core.errors import InvalidInputError, SummarizationError
from .summary import Summary, SummaryInput, check_content

__all__ = ["DATE_PATTERN", "ExtractiveSummarizer", "extract_key_entities", "split_sentences"]


# A period after one of these (or after a single letter, an initial) does not end a sentence. Company
# suffixes (Inc., Corp.) and etc. are left out: they end sentences more often than not.
def _wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


_ABBREVIATIONS = _wordset(
    "mr mrs ms dr prof st jr sr vs dept approx no fig jan feb mar apr jun jul aug sep sept oct nov dec "
    "mon tue wed thu fri sat sun e.g i.e a.m p.m u.s"
)
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)|\n")
_BULLETS = "-*•·>#"
_WORD = re.compile(r"[^\W_][\w'’&.-]*")
_MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December|"
    "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)
_WEEKDAYS = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
DATE_PATTERN = re.compile(
    rf"\b\d{{4}}-\d{{2}}-\d{{2}}(?:[T ]\d{{2}}:\d{{2}}(?::\d{{2}})?)?\b"
    rf"|\b\d{{1,2}}[/.]\d{{1,2}}[/.]\d{{2,4}}\b"
    rf"|\b(?:{_MONTHS})\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)? (?:{_MONTHS})\.?(?:,? \d{{4}})?\b"
    rf"|\b(?:{_MONTHS}) \d{{4}}\b"
    rf"|\b(?:{_WEEKDAYS})\b"
)
_MONEY = re.compile(
    r"[$€£¥]\s?\d[\d,.]*(?:\s?(?:k|m|bn|million|billion))?"
    r"|\b\d[\d,.]*\s?(?:USD|EUR|GBP|dollars|euros|pounds)\b",
    re.IGNORECASE,
)
_TOKEN_WITH_DIGIT = re.compile(r"(?<![\w-])[$€£#]?[^\W_][\w\-/.,:%#]*")
# Sentence-initial words that are capitalized only because they start the sentence.
_INITIAL_STOPWORDS = _wordset(
    "a an the in on at for from to of by with and but or so if when while after before since during "
    "this that these those there here it its he she they we i you his her their our my your "
    "user users yesterday today tomorrow also then"
)
_NAME_CONNECTORS = frozenset({"of", "de", "da", "del", "der", "van", "von", "la", "le", "du", "&"})


def split_sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the sentences of `text`; each span is a verbatim, stripped substring."""
    spans: list[tuple[int, int]] = []
    start = 0

    def close(end: int) -> None:
        s, e = start, end
        while s < e and (text[s].isspace() or text[s] in _BULLETS):
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if any(ch.isalnum() for ch in text[s:e]):
            spans.append((s, e))

    for match in _SENTENCE_END.finditer(text):
        if match.group() != "\n":
            before = re.search(r"([\w.]+)$", text[start : match.start()])
            word = before.group(1).lower() if before else ""
            if match.group().startswith(".") and (
                word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())
            ):
                continue
            following = text[match.end() :].lstrip()
            if following[:1].islower():  # "e.g. the user", "approx. ten" run on
                continue
        close(match.end() if match.group() != "\n" else match.start())
        start = match.end()
    close(len(text))
    return spans


def _words_after_first(sentence: str) -> list[str]:
    words = _WORD.findall(sentence)
    return words[1:]


def _information_score(sentence: str) -> float:
    named = sum(1 for w in _words_after_first(sentence) if w[:1].isupper() and w != "I")
    numbers = sum(1 for t in _TOKEN_WITH_DIGIT.findall(sentence) if any(c.isdigit() for c in t))
    return named + numbers + len(DATE_PATTERN.findall(sentence)) + len(_MONEY.findall(sentence))


def _truncate_at_word(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1]
    space = max(cut.rfind(" "), cut.rfind("\n"), cut.rfind("\t"))
    if space > 0:
        cut = cut[:space]
    return cut.rstrip(" ,;:-–—\t\n") + "…"


# Words that carry no findable content: English stop words and conversational filler. A summary drops
# filler words and filler sentences ("Thanks!", "Wow, that's great!"); everything else is content.
_STOPWORDS = _wordset(
    "a an the and or but nor so yet for of to in on at by with from into onto about as than then that this "
    "these those there here it its it's i me my mine we us our ours you your yours he him his she her hers "
    "they them their theirs what which who whom whose when where why how is am are was were be been being "
    "have has had having do does did doing will would shall should can could may might must not no yes "
    "if because while until up down out off over under again further once all any both each few more most "
    "other some such only own same too very just also now i'm i've i'd i'll you're you've that's there's "
    "let's can't don't didn't won't isn't wasn't aren't gonna wanna got get gets getting really"
)
_FILLER = _wordset(
    "wow oh ooh hey hi hello haha hahaha lol yeah yep yup um uh hmm omg ah aw aww awww ok okay well "
    "totally super thanks thank cool great nice awesome amazing glad sure congrats congratulations dear "
    "bye cheers absolutely definitely said say says told tell named called thing things lot lots"
)
_INTERJECTIONS = (
    "wow|oh|ooh|hey|hi|hello|haha|hahaha|lol|yeah|yep|yup|um|uh|hmm|omg|ah|aw|aww|awww|ok|okay|well|so"
)
# Interjections opening a sentence, after an optional "Speaker:" label: "Melanie: Wow, ..." -> "Melanie: ..."
_OPENING_FILLER = re.compile(
    rf"^((?:[^\W\d_][\w .'-]{{0,40}}:\s+)?)(?:(?:{_INTERJECTIONS})\b[,!.…]*\s+)+", re.IGNORECASE
)


def _content_words(text: str) -> list[str]:
    """Words that make a memory findable: not stop words or filler; numbers and ids always count."""
    out = []
    for w in _WORD.findall(text):
        word = w.strip(".-'’&")
        key = word.casefold().replace("’", "'")
        if not word or key in _STOPWORDS or key in _FILLER:
            continue
        if len(word) >= 3 or any(c.isdigit() for c in word):
            out.append(word)
    return out


# Words a summary can drop without losing a findable term: articles and intensifiers.
_DROPPABLE = re.compile(
    r"(?<![\w'’-])(?:a|an|the|so|very|really|just|totally|super|actually|literally)\s+(?=\w)", re.IGNORECASE
)


def _compress(sentence: str) -> str:
    """Drop articles and intensifiers: 'I went to the beach, it was so fun' -> 'I went to beach, it was fun'."""
    out = _DROPPABLE.sub("", sentence)
    return out[:1].upper() + out[1:] if sentence[:1].isupper() else out


def _drop_filler_words(sentence: str) -> str:
    """'Melanie: Wow, I ran the Boston marathon!' -> 'Melanie: I ran the Boston marathon!' (same terms)."""
    out = _OPENING_FILLER.sub(lambda m: m.group(1), sentence, count=1)
    if out == sentence or not _content_words(out):
        return sentence  # nothing left but filler: keep as written
    label = len(_OPENING_FILLER.match(sentence).group(1))  # type: ignore[union-attr]
    return out[:label] + out[label : label + 1].upper() + out[label + 1 :]


class ExtractiveSummarizer:
    """Offline and deterministic. Keeps what makes a memory findable, not its wording:

    * the 1-3 most informative sentences (named entities, numbers, dates, money, content words), in their
      order, without filler sentences ("Thanks!") or filler words ("wow", "haha", "really");
    * every name, number, date and content word of the sentences it left out, appended as
      "(also: …)", so full text and the summary embedding still see them;
    * at most max_chars (a single very long sentence is cut at a word, ending in "…").
    """

    model = "extractive-v2"
    kind = "extractive-offline"

    def __init__(self, max_sentences: int = 3, max_chars: int = 400):
        if not 1 <= max_sentences <= 3:
            raise InvalidInputError("max_sentences", max_sentences, "must be 1, 2 or 3")
        if max_chars < 20:
            raise InvalidInputError("max_chars", max_chars, "must be at least 20")
        self.max_sentences = max_sentences
        self.max_chars = max_chars

    def _ranked(self, content: str) -> tuple[list[str], list[int]]:
        sentences = [content[s:e] for s, e in split_sentences(content)]
        if not sentences:
            raise SummarizationError("memory content has no words to summarize")
        # Sentences without a content word ("Thanks!", "Wow, so cool!") go last; the first sentence usually
        # names the topic: a small bonus breaks ties in its favour.
        scores = [
            (_information_score(s) + 0.25 * len(_content_words(s)) + (0.5 if i == 0 else 0.0))
            if _content_words(s)
            else -1.0
            for i, s in enumerate(sentences)
        ]
        return sentences, sorted(range(len(sentences)), key=lambda i: (-scores[i], i))

    def select_sentences(self, content: str) -> list[str]:
        """The summary's sentences: substrings of `content` (a cut one ends in '…'), 1 to 3 of them."""
        sentences, ranked = self._ranked(content)
        informative = [i for i in ranked if _content_words(sentences[i])] or ranked[:1]
        chosen = informative[: self.max_sentences]
        while len(chosen) > 1 and sum(len(sentences[i]) + 1 for i in chosen) - 1 > self.max_chars:
            chosen.pop()  # the least informative goes first
        chosen.sort()
        picked = [sentences[i] for i in chosen]
        if len(picked) == 1:
            picked[0] = _truncate_at_word(picked[0], self.max_chars)
        return picked

    def summary_text(self, content: str) -> str:
        picked = self.select_sentences(content)
        text = " ".join(_compress(_drop_filler_words(p)) for p in picked)
        have = {w.casefold() for w in _content_words(text)}
        missing: list[str] = []
        for term in [*extract_key_entities(content, limit=50), *_content_words(content)]:
            words = {w.casefold() for w in _content_words(term)}
            if words and not words <= have:
                have |= words
                missing.append(term)
        for term in missing:  # in order of importance: entities first, then content words
            extra = f" (also: {', '.join([*_also(text), term])})"
            if len(_strip_also(text)) + len(extra) > self.max_chars:
                break
            text = _strip_also(text) + extra
        return text

    def summarize(self, item: SummaryInput) -> Summary:
        check_content(item)
        text = self.summary_text(item.content)
        return Summary(
            text=text,
            model=self.model,
            kind=self.kind,
            input_tokens=len(item.content.split()),
            output_tokens=len(text.split()),
            cost_usd=0.0,
        )


_ALSO = re.compile(r" \(also: (.*)\)$")


def _also(text: str) -> list[str]:
    m = _ALSO.search(text)
    return m.group(1).split(", ") if m else []


def _strip_also(text: str) -> str:
    return _ALSO.sub("", text)


def extract_key_entities(text: str, limit: int = 10) -> list[str]:
    """Names, places, projects, dates and identifiers ("ORD-4417") of `text`, first-seen order, no repeats."""
    candidates: list[tuple[int, int, str]] = []
    for match in DATE_PATTERN.finditer(text):
        if not re.fullmatch(_WEEKDAYS, match.group()):
            candidates.append((match.start(), match.end(), match.group()))
    for match in _TOKEN_WITH_DIGIT.finditer(text):
        token = match.group().rstrip(".,:/-")
        if any(c.isdigit() for c in token):
            candidates.append((match.start(), match.start() + len(token), token))
    for s, e in split_sentences(text):
        candidates.extend(_capitalized_spans(text, s, e))

    # Longest match wins where matches overlap ("March 3, 2024" over "March" and "3").
    candidates.sort(key=lambda c: (c[0], -(c[1] - c[0])))
    entities: list[str] = []
    seen: set[str] = set()
    taken_until = -1
    for start, end, value in candidates:
        if start < taken_until:
            continue
        taken_until = end
        key = value.casefold()
        if key not in seen:
            seen.add(key)
            entities.append(value)
            if len(entities) >= limit:
                break
    return entities


def _capitalized_spans(text: str, sent_start: int, sent_end: int) -> list[tuple[int, int, str]]:
    words = [
        (m.start() + sent_start, m.end() + sent_start, m.group())
        for m in _WORD.finditer(text[sent_start:sent_end])
    ]
    spans: list[tuple[int, int, str]] = []
    i = 0
    while i < len(words):
        if not _is_capitalized(words[i][2]):
            i += 1
            continue
        j = i + 1
        while j < len(words):
            previous = words[j - 1][2]
            if text[words[j - 1][1] : words[j][0]] != " ":
                break
            if previous.endswith(".") and previous[:-1].lower() not in _ABBREVIATIONS and len(previous) > 2:
                break  # "Acme Corp. Her": the period ended the name
            if _is_capitalized(words[j][2]):
                j += 1
            elif words[j][2] in _NAME_CONNECTORS and j + 1 < len(words) and _is_capitalized(words[j + 1][2]):
                j += 2
            else:
                break
        span = words[i:j]
        if i == 0:
            # Sentence-initial: drop words capitalized only by position; a lone remaining
            # sentence-initial word ("Maria", "Yesterday") is ambiguous and skipped.
            dropped = 0
            while span and span[0][2].lower() in _INITIAL_STOPWORDS:
                span = span[1:]
                dropped += 1
            if not span or (dropped == 0 and len(span) < 2):
                span = []
        while span and span[-1][2] in _NAME_CONNECTORS:
            span.pop()
        if span and not (len(span) == 1 and span[0][2] == "I"):
            value = text[span[0][0] : span[-1][1]].rstrip(".")
            if not any(c.isdigit() for c in value):  # tokens with digits are found on their own
                spans.append((span[0][0], span[0][0] + len(value), value))
        i = j
    return spans


def _is_capitalized(word: str) -> bool:
    return word[:1].isupper()
