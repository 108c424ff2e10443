"""`make demo` prints what the getting-started page shows: its sample output, line for line.

The sample is the ```text block after `<!-- demo-output -->` in docs/getting-started.md. Each of its lines
is a template for one or more consecutive lines of the demo's output. Which memories a night archives
depends on the hour the demo runs (decay counts from now), so what is data matches anything of its kind:
numbers (counts, sizes, seconds, dates) and the plural of a counted noun, ids (8 hex digits or a UUID), month names, user ids, quoted
texts, archive reasons in brackets, a tier in parentheses, the text of a search hit (`[*] rank. score
tier text`) and of an archive row (`summary:`, `original:`); `…` in the sample matches any text (paths,
the backfill's id). Every output line must match the template at its place and every template at least
one line, so a line added, dropped or reworded on either side fails the test. Blank lines are ignored.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from tests.packaging.conftest import ROOT, DemoRun

PAGE = ROOT / "docs" / "getting-started.md"
MARKER = "<!-- demo-output -->"


def sample_lines(page: Path = PAGE) -> list[str]:
    text = page.read_text()
    assert MARKER in text, f"{page}: no {MARKER} line before the demo's sample output"
    block = re.match(r"\s*```text\n(.*?)\n```", text[text.index(MARKER) + len(MARKER) :], re.S)
    assert block is not None, f"{page}: {MARKER} is not followed by a ```text block"
    return [line for line in block.group(1).splitlines() if line.strip()]


_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_KINDS = [  # (sample token, what it matches in the output)
    ("…", ".*"),
    (r"'[^']*'|\"[^\"]*\"", r"(?:'.*'|\".*\")"),
    (
        r"\b(?=[0-9a-f]*\d)[0-9a-f]{8}(?:-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})?\b",
        r"[0-9a-f]{8}(?:-[0-9a-f-]{27})?",
    ),
    (rf"\b(?:{_MONTHS})\b", rf"(?:{_MONTHS})"),
    (r"\buser-[a-z]+", r"user-[a-z]+"),
    (r"\[[a-z_]+\]", r"\[[a-z_]+\]"),
    (r"\((?:hot|archived)\)", r"\((?:hot|archived)\)"),
    (r"\d[\d.,]*\d|\d", r"\d[\d.,]*"),
    (r" +", r" +"),
    (r"\b(?:night|run|user|source)s?\b", ""),  # counted nouns: singular or plural, as the count says
]
_TOKENS = re.compile("|".join(f"({pattern})" for pattern, _ in _KINDS))


# Lines whose text is data: a search hit (`[*] rank. score tier text`), an archive row's summary and original.
_DATA_LINES = [
    re.compile(r"(?:\* +)?\d+\. \d\.\d{3} +(?:hot|archived) +.*"),
    re.compile(r"summary: +.*"),
    re.compile(r"original: +.*"),
]


def template(line: str) -> re.Pattern[str]:
    """The regex of one sample line (see the module docstring)."""
    out, pos = [], 0
    line = line.strip()
    for data in _DATA_LINES:
        if data.fullmatch(line):
            return data
    for m in _TOKENS.finditer(line):
        out.append(re.escape(line[pos : m.start()]))
        kind = _KINDS[m.lastindex - 1][1]  # type: ignore[operator]  # one group matched
        out.append(kind or re.escape(m.group().removesuffix("s")) + "s?")
        pos = m.end()
    out.append(re.escape(line[pos:]))
    return re.compile("".join(out))


def mismatches(sample: list[str], output: list[str]) -> list[str]:
    """Where `output` departs from `sample` (empty when it follows it), by the module docstring's rules."""
    templates = [template(s) for s in sample]
    lines = [line.strip() for line in output if line.strip()]
    problems: list[str] = []
    i = 0
    for n, (text, pattern) in enumerate(zip(sample, templates, strict=True)):
        if i >= len(lines) or not pattern.fullmatch(lines[i]):
            got = lines[i] if i < len(lines) else "<end of output>"
            problems.append(f"sample line {n + 1} {text!r} does not match output line {i + 1} {got!r}")
            return problems
        i += 1
        # Further lines of the same shape (one per run, archive row, fact), unless the next template takes them.
        following = templates[n + 1] if n + 1 < len(templates) else None
        while (
            i < len(lines)
            and pattern.fullmatch(lines[i])
            and not (following and following.fullmatch(lines[i]))
        ):
            i += 1
    problems += [f"output line {j + 1} {lines[j]!r} is not in the sample" for j in range(i, len(lines))]
    return problems


def test_templates_match_numbers_text_and_repeated_lines() -> None:
    sample = ["== Check results", "run 1/2 …: claimed 10, archived 10 (25 s)", "byte-exact: YES"]
    assert template("memory 0fc05531 for June 2026 (7.5 s)").fullmatch("memory 6cad4a26 for May 2027 (12 s)")
    assert not template("memory 0fc05531 for June").fullmatch("memory 6cad4a26 for Monday")
    hit = template("*  1. 1.000 hot      Small talk: Ada mentioned the weather.")
    assert hit.fullmatch("2. 0.937 archived [archived] Small talk: foggy.") and not hit.fullmatch("2. hot x")
    row = template("- user-ada 2026-06-30 [stale_low_importance] 0fc05531 'Tom asked Ada' (hot)")
    assert row.fullmatch('- user-chen 2026-07-01 [force_age] 2850c557 "Chen\'s hotel" (archived)')
    assert not row.fullmatch("- user-chen 2026-07-01 [force_age] 2850c557 'x' (stub)")
    assert template("2 runs in 1 night").fullmatch("1 run in 30 nights")
    ok = [
        "== Check results",
        "run  1/13 a..b: claimed 1,146, archived 1146 (22 s)",
        "run 2/13 c: claimed 1, archived 1 (8 s)",
        "byte-exact: YES",
    ]
    assert mismatches(sample, ok) == []
    assert mismatches(sample, [*ok, "an extra line ()"])  # a line the sample lacks
    assert mismatches(sample, ok[:1] + ok[3:])  # a sample line the output lacks
    assert mismatches(sample, [ok[0], "run 1/2 x: claimed 10, kept 10 (25 s)", ok[3]])  # a reworded line


@pytest.mark.slow
def test_demo_prints_the_documented_sample(demo: DemoRun) -> None:
    proc = demo.proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    problems = mismatches(sample_lines(), proc.stdout.splitlines())
    assert not problems, "\n".join(problems[:10])
    # Nothing but the demo's own lines: no third-party warning on stderr.
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]


# The facts section: "who is X?" and one line per fact, "subject predicate object (from …, still valid|until …; …)".
_FACT_LINE = re.compile(
    r"- (.+?) (has manager|birthday|lives in|works on team|works at|is|works with) (.+?) \(from "
)
_SINGLE_VALUED = ("has manager", "birthday", "lives in", "works on team", "works at")


def printed_contradictions(output: list[str]) -> list[str]:
    """What the demo's printed facts say against each other: two birthdays of one person, two current
    values of a single-valued attribute (lives in, has manager, ...), or the user's manager holding
    another role for the same user ("X is doctor of Ada" and "Ada has manager X")."""
    facts = [
        (m.group(1), m.group(2), m.group(3), "still valid;" in line)
        for line in output
        if (m := _FACT_LINE.match(line.strip()))
    ]
    problems = []
    for (subject, predicate), group in itertools.groupby(
        sorted((s, p, o, now) for s, p, o, now in facts if p in _SINGLE_VALUED), key=lambda f: f[:2]
    ):
        values = list(group)
        if predicate == "birthday" and len({o for _, _, o, _ in values}) > 1:
            problems.append(f"{subject} has {len(values)} birthdays")
        elif sum(now for *_, now in values) > 1:
            problems.append(f"{subject} {predicate}: {len(values)} current values")
    managers = {(o, s) for s, p, o, _ in facts if p == "has manager"}  # (manager, of whom)
    problems += [
        f"{s} is {o} and {o.rsplit(' of ', 1)[-1]}'s manager"
        for s, p, o, _ in facts
        if p == "is" and " of " in o and (s, o.rsplit(" of ", 1)[-1]) in managers
    ]
    return problems


def test_printed_contradictions_finds_what_the_demo_used_to_print() -> None:
    """The facts an earlier demo printed: the manager was also the doctor and had four birthdays."""
    earlier = [
        "who is Sofia Lindqvist? (user-ada, answered from facts, with their sources)",
        "  - Sofia Lindqvist is doctor of Ada (from 2026-07-03, still valid; 13 sources, 0 archived: …)",
        "  - Ada has manager Sofia Lindqvist (from 2026-06-30, still valid; 1 source, 0 archived: …)",
        "  - Sofia Lindqvist birthday 21 July 2026 (from 2026-06-30, until 2026-07-01; 1 source, 0 archived: …)",
        "  - Sofia Lindqvist birthday 15 August 2026 (from 2026-07-01, until 2026-07-05; 1 source, 1 archived: …)",
        "  - Ada lives in Lisbon (from 2026-06-30, still valid; 1 source, 0 archived: …)",
        "  - Ada lives in Porto (from 2026-09-30, still valid; 1 source, 0 archived: …)",
    ]
    assert sorted(printed_contradictions(earlier)) == [
        "Ada lives in: 2 current values",
        "Sofia Lindqvist has 2 birthdays",
        "Sofia Lindqvist is doctor of Ada and Ada's manager",
    ]
    coherent = [
        "  - Ada has manager Rafael Costa (from 2026-07-02, still valid; 1 source, 0 archived: …)",
        "  - Rafael Costa birthday November 19 (from 2026-07-02, still valid; 1 source, 1 archived: …)",
        "  - Ada lives in Lisbon (from 2026-07-02, until 2026-09-21; 1 source, 0 archived: …)",
        "  - Ada lives in Porto (from 2026-09-21, still valid; 1 source, 0 archived: …)",
    ]
    assert printed_contradictions(coherent) == []


@pytest.mark.slow
def test_the_demo_prints_no_contradicting_facts(demo: DemoRun) -> None:
    assert demo.proc.returncode == 0, demo.proc.stdout[-3000:] + demo.proc.stderr[-3000:]
    lines = demo.proc.stdout.splitlines()
    assert any(_FACT_LINE.match(line.strip()) for line in lines), "the demo printed no facts"
    assert printed_contradictions(lines) == []
