"""The retrievability probe asks with a memory's most specific sentence, not its first: a chat turn that
opens with "That's amazing!" would rank many memories alike, hot or archived."""

from __future__ import annotations

from memory_lib.archival.retrievability import probe_question


def test_the_question_is_the_sentence_with_the_most_distinct_words() -> None:
    turn = (
        "Caroline: That's amazing! You put much effort into it. "
        "Seeing how art can be a source of self-expression and growth is inspiring."
    )
    assert (
        probe_question(turn) == "Seeing how art can be a source of self-expression and growth is inspiring."
    )


def test_the_first_of_equals_verbatim_and_bounded() -> None:
    assert probe_question("Paid 84 EUR for power. Went home early.") == "Paid 84 EUR for power."
    assert probe_question("no end mark here") == "no end mark here"
    long = "word " * 200 + "end."
    question = probe_question(long)
    assert len(question) <= 300 and long.startswith(question)
