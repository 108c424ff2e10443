"""The demo history is deterministic and shaped like a real agent's memory."""

from __future__ import annotations

import itertools
import re
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from memory_assets.demo_data import DemoMemory, generate_history
from memory_lib.consolidation.facts import Fact, RuleFactExtractor
from memory_lib.consolidation.sources import SourceMemory
from memory_lib.llm.summarize import ExtractiveSummarizer, extract_key_entities
from memory_lib.write.write_path import find_secret

END = datetime(2026, 11, 1, tzinfo=UTC)


def test_same_arguments_same_history():
    a = list(generate_history(end=END, days=30))
    b = list(generate_history(end=END, days=30))
    assert a == b
    assert list(generate_history(end=END, days=30, seed=8)) != a


def test_shape_of_eighteen_months():
    mems = list(generate_history(end=END))
    per_day = Counter((m.created_at.date()) for m in mems if m.category != "core")
    assert len(per_day) == 540
    assert min(per_day.values()) >= 50 and max(per_day.values()) <= 100
    assert len({m.user_id for m in mems}) == 4
    assert min(m.created_at for m in mems) >= END - timedelta(days=540)
    assert len({m.id for m in mems}) == len(mems)
    # Names, numbers and dates appear in the text.
    assert sum(bool(re.search(r"\d", m.content)) for m in mems) / len(mems) > 0.8
    assert sum(bool(re.search(r"\b[A-Z][a-z]+ [A-Z][a-z]+\b", m.content)) for m in mems) / len(mems) > 0.3
    # Hot / warm / cold: most memories are routine and cold, a minority matters.
    imp = [m.importance_score for m in mems]
    cold = sum(i <= 0.3 for i in imp) / len(imp)
    hot = sum(i >= 0.6 for i in imp) / len(imp)
    assert 0.45 < cold < 0.8 and 0.05 < hot < 0.3
    # Old, unimportant memories are rarely used lately; core facts are used often.
    core = [m for m in mems if m.category == "core"]
    assert core and all(m.access_count >= 20 for m in core)
    recent = END - timedelta(days=30)
    stale_cold = [m for m in mems if m.importance_score <= 0.3 and m.created_at < END - timedelta(days=120)]
    assert (
        sum(bool(m.last_accessed_at and m.last_accessed_at > recent) for m in stale_cold) / len(stale_cold)
        < 0.2
    )


def test_scales_past_100k():
    n = sum(1 for _ in generate_history(end=END, days=1400, per_day=(70, 90)))
    assert n > 100_000


@pytest.mark.parametrize("kwargs", [{"days": 0}, {"users": 9}, {"per_day": (10, 5)}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        list(generate_history(end=END, **kwargs))


# --------------------------------------------------------------------------- a coherent world


def _facts(mems: list[DemoMemory], *, summaries: bool) -> dict[str, list[Fact]]:
    """The facts the demo's offline extractor finds in each user's history, month by month as the demo's
    consolidation builds them: in the memories as written (hot) or in their extractive summaries (what
    consolidation reads once they are archived)."""
    summarizer = ExtractiveSummarizer()
    out: dict[str, list[Fact]] = defaultdict(list)
    by_month = sorted(mems, key=lambda m: (m.user_id, m.created_at.year, m.created_at.month))
    for (user, *_), month in itertools.groupby(
        by_month, key=lambda m: (m.user_id, m.created_at.year, m.created_at.month)
    ):
        sources = [
            SourceMemory(
                m.id,
                m.user_id,
                "archived" if summaries else "hot",
                summarizer.summary_text(m.content) if summaries else m.content,
                m.created_at,
                m.created_at,
                m.importance_score,
                m.domain,
                tuple(extract_key_entities(m.content, limit=20)),
            )
            for m in month
        ]
        out[user] += RuleFactExtractor().extract(sources)
    return out


def contradictions(facts: list[Fact], memories: dict[uuid.UUID, tuple[str, datetime]]) -> list[str]:
    """What one user's facts (and their source memories: text, created_at) say against each other:
    * a person with two birthdays;
    * a role held for someone ("doctor of Ada", "Ada has manager X") by two people at once, or one person
      holding two roles for the same person;
    * a single-valued attribute (lives in, has manager, works on team, ...) whose value changes without a
      memory stating the change (one of the new value's sources names the old value), or whose old value
      is still said after the new one.
    """
    problems = []
    birthdays: dict[str, set[str]] = defaultdict(set)
    holders: dict[tuple[str, str], set[str]] = defaultdict(set)  # (role, of whom) -> people
    roles: dict[tuple[str, str], set[str]] = defaultdict(set)  # (person, of whom) -> roles
    chains: dict[tuple[str, str], list[Fact]] = defaultdict(list)
    for f in facts:
        if f.predicate == "birthday":
            birthdays[f.subject].add(f.object.casefold())
        elif f.predicate == "is" and " of " in f.object:
            role, whom = f.object.split(" of ", 1)
            holders[(role, whom)].add(f.subject)
            roles[(f.subject, whom)].add(role)
        elif f.predicate == "has manager":
            roles[(f.object, f.subject)].add("manager")
        if f.single_valued:
            chains[(f.subject, f.predicate)].append(f)
    problems += [f"{p} has {len(b)} birthdays: {sorted(b)}" for p, b in birthdays.items() if len(b) > 1]
    problems += [f"{sorted(h)} are all {r} of {w}" for (r, w), h in holders.items() if len(h) > 1]
    problems += [f"{p} is {sorted(r)} of {w}" for (p, w), r in roles.items() if len(r) > 1]
    for (subject, predicate), chain in chains.items():
        values: dict[str, list[uuid.UUID]] = defaultdict(list)  # object -> sources, case-insensitive
        for f in sorted(chain, key=lambda f: f.valid_from):
            values[f.object.casefold()] += f.source_memory_ids
        for (old, old_ids), (new, new_ids) in itertools.pairwise(values.items()):
            if not any(old in memories[i][0].casefold() for i in new_ids):
                problems.append(f"{subject} {predicate}: {old!r} then {new!r}, no memory states the change")
            if max(memories[i][1] for i in old_ids) > min(memories[i][1] for i in new_ids):
                problems.append(f"{subject} {predicate}: {old!r} is said again after {new!r}")
    return problems


def test_contradictions_finds_what_the_old_generator_wrote():
    """The rules catch the stories the demo used to tell (a person with four birthdays, a manager who
    is also the doctor, values that flip without a word), and accept a change that is stated."""
    t0 = datetime(2026, 7, 1, tzinfo=UTC)
    texts = [
        "Ada's manager is Sofia Lindqvist; their 1:1 is every Monday.",
        "Ada is allergic to penicillin; the doctor, Sofia Lindqvist, noted it on 03 July 2026.",
        "Sofia Lindqvist's birthday is on 23 July 2026; Ada plans to send a gift from Kyoto.",
        "Sofia Lindqvist's birthday is on 17 August 2026; Ada plans to send a gift from Seoul.",
        "Ada lives in Lisbon and works on the payments team.",
        "Ada lives in Berlin and works on the payments team.",
        "Ada lives in Lisbon and works on the payments team.",
    ]
    mems = [
        SourceMemory(uuid.UUID(int=i + 1), "user-ada", "hot", t, t0 + timedelta(days=i), t0, 0.5, None)
        for i, t in enumerate(texts)
    ]
    found = contradictions(RuleFactExtractor().extract(mems), {m.id: (m.text, m.created_at) for m in mems})
    assert any("Sofia Lindqvist has 2 birthdays" in p for p in found), found
    assert "Sofia Lindqvist is ['doctor', 'manager'] of Ada" in found, found
    assert any("lives in: 'lisbon' then 'berlin', no memory states the change" in p for p in found), found
    assert any("'lisbon' is said again after 'berlin'" in p for p in found), found

    stated = (
        mems[:1]
        + [
            SourceMemory(uuid.UUID(int=99), "user-ada", "hot", t, t0 + timedelta(days=9), t0, 0.5, None)
            for t in ["Ada moved to Porto from Lisbon on July 10; the new flat is EUR 1100 a month."]
        ]
        + mems[4:5]
    )
    assert (
        contradictions(RuleFactExtractor().extract(stated), {m.id: (m.text, m.created_at) for m in stated})
        == []
    )


@pytest.mark.parametrize("summaries", [False, True], ids=["hot", "archived summaries"])
def test_the_demo_world_has_no_contradiction(summaries):
    """The demo's default history (149 days, 4 users), read by the offline fact extractor as the demo's
    consolidation reads it: no person with two birthdays, no role held twice, no unstated change; and the
    stated changes are there (so the facts do change, by a memory that says so)."""
    mems = list(generate_history(end=END, days=149))
    by_id = {m.id: (m.content, m.created_at) for m in mems}
    facts = _facts(mems, summaries=summaries)
    for user, user_facts in facts.items():
        assert contradictions(user_facts, by_id) == [], user
    values = defaultdict(set)
    for user, user_facts in facts.items():
        for f in user_facts:
            if f.single_valued:
                values[(user, f.predicate)].add(f.object)
    assert values[("user-ada", "lives in")] == {"Lisbon", "Porto"}
    assert len(values[("user-bruno", "has manager")]) == 2
    assert values[("user-chen", "works on team")] == {"mobile", "growth"}
    assert len(values[("user-dara", "lives in")]) == len(values[("user-dara", "has manager")]) == 1
    birthdays = [f for user_facts in facts.values() for f in user_facts if f.predicate == "birthday"]
    assert len(birthdays) >= 8  # the reminders are there, one date per person


def test_every_memory_is_storable_and_most_say_something_new():
    """No generated memory looks like a credential (MemoryClient.add would refuse it), and the history is
    not one sentence repeated with another number: few memories repeat another word for word."""
    mems = list(generate_history(end=END, days=149))
    assert not [m.content for m in mems if find_secret(m.content)]
    repeats = len(mems) - len({(m.user_id, m.content) for m in mems})
    assert repeats / len(mems) < 0.05


@pytest.mark.parametrize("end", [datetime(2026, 2, 10, tzinfo=UTC), datetime(2026, 8, 20, tzinfo=UTC)])
def test_the_demo_says_the_same_about_adas_manager_whatever_the_day(end):
    """The demo prints "who is <Ada's manager>?" from facts, and getting-started shows it: whatever day the
    demo runs (its history ends yesterday), the manager's facts are of the same kinds (manager of Ada, one
    birthday, the team's first project), so the printed lines keep their shape."""
    mems = [m for m in generate_history(end=end, days=149) if m.user_id == "user-ada"]
    facts = _facts(mems, summaries=False)["user-ada"]
    (manager,) = {f.object for f in facts if f.predicate == "has manager"}
    about = {(f.predicate, f.object) for f in facts if manager in (f.subject, f.object)}
    (birthday,) = [o for p, o in about if p == "birthday"]
    assert about == {("has manager", manager), ("birthday", birthday), ("works with", "Project Atlas")}
