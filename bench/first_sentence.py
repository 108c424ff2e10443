"""The locomo bench's terse-LLM imitation: a memory's first sentence, names and numbers dropped."""

from __future__ import annotations

import re

from memory_lib.core.errors import SummarizationError
from memory_lib.llm.summarize import (
    Summary,
    SummaryInput,
    check_summary_text,
    split_sentences,
)

_SPEAKER = re.compile(r"^[^\s:][^:\n]{0,40}:\s+")


_TOKEN_CORE = re.compile(r"[^\W_][\w'’&.-]*")


_MONTH_DAY = re.compile(
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December|"
    r"Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|Monday|Tuesday|Wednesday|Thursday|Friday|"
    r"Saturday|Sunday|Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)s?\.?"
)


_NUMBER_WORDS = frozenset(
    [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
        "thirty",
        "forty",
        "fifty",
        "sixty",
        "seventy",
        "eighty",
        "ninety",
        "hundred",
        "thousand",
        "million",
        "billion",
        "dozen",
    ]
)


class FirstSentenceSummarizer:
    """Bench only: imitates a terse LLM summary. The memory's first sentence (after a leading "Speaker:"
    label), with capitalised names, digits and numbers, month and weekday names dropped. A capitalised
    word counts as a name anywhere but at the start of a sentence, or there too when it is the speaker or
    appears capitalised later in the text ("I" stays). When nothing of the first sentence shares a word
    with the memory (the archive refuses such a summary), the next sentence that does is taken. No
    entities: a terse answer names none."""

    model = "first-sentence-v1"
    kind = "bench-first-sentence"

    def summary_text(self, content: str) -> str:
        label = _SPEAKER.match(content)
        speaker = set(label.group().rstrip(": \t").split()) if label else set()
        text = content[label.end() :] if label else content
        spans = split_sentences(text) or [(0, len(text))]
        names = set(speaker)
        for s, e in spans:  # capitalised where no sentence starts: a name
            for i, m in enumerate(_TOKEN_CORE.finditer(text[s:e])):
                if i > 0 and m.group()[:1].isupper():
                    names.add(m.group())
        candidates = [self._reduce(text[s:e], names) for s, e in spans]
        for reduced in [*candidates, " ".join(candidates)]:
            try:
                check_summary_text(reduced, content, source=f"{self.kind}:{self.model}")
            except SummarizationError:
                continue
            if reduced:
                return reduced
        return text[spans[0][0] : spans[0][1]]  # nothing survives the drop: the sentence as written

    @staticmethod
    def _reduce(sentence: str, names: set[str]) -> str:
        kept = []
        for i, token in enumerate(sentence.split()):
            m = _TOKEN_CORE.search(token)
            if m is None:
                continue
            word = m.group()
            bare = word.rstrip(".,'’")
            capitalised = word[:1].isupper() and word != "I" and not word.startswith(("I'", "I’"))
            name = capitalised and (i > 0 or word in names or bare in names)
            number = any(c.isdigit() for c in word) or bare.lower() in _NUMBER_WORDS
            if name or number or _MONTH_DAY.fullmatch(bare):
                continue
            kept.append(token)
        return " ".join(kept).strip(" ,;:-")

    def summarize(self, item: SummaryInput) -> Summary:
        text = self.summary_text(item.content)
        return Summary(
            text=text,
            model=self.model,
            kind=self.kind,
            input_tokens=len(item.content.split()),
            output_tokens=len(text.split()),
            cost_usd=0.0,
            entities=(),
        )
