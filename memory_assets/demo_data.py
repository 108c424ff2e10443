"""A deterministic, realistic multi-user agent memory history.

Several users, ~18 months of memories, 50-100 a day across users, with names, places, projects,
numbers and dates. Importance and access follow the storage tiers: most memories are routine and
go cold (low importance, rarely used), a minority stays warm, a few are core facts used often.
The same arguments always give the same memories (ids, text, timestamps and scores).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

USERS = {
    "user-ada": {"name": "Ada", "city": "Lisbon", "team": "payments"},
    "user-bruno": {"name": "Bruno", "city": "Porto", "team": "search"},
    "user-chen": {"name": "Chen", "city": "Singapore", "team": "mobile"},
    "user-dara": {"name": "Dara", "city": "Dublin", "team": "data platform"},
}
PEOPLE = [
    "Maya Patel",
    "Jonas Weber",
    "Lucia Romero",
    "Kenji Sato",
    "Amara Okafor",
    "Tom Becker",
    "Priya Nair",
    "Omar Haddad",
    "Sofia Lindqvist",
    "Diego Alvarez",
    "Hannah Kim",
    "Yusuf Demir",
]
PLACES = [
    "Lisbon",
    "Berlin",
    "Kyoto",
    "Nairobi",
    "Reykjavik",
    "Montreal",
    "Oaxaca",
    "Tallinn",
    "Cape Town",
    "Seoul",
    "Edinburgh",
    "Valparaiso",
]
PROJECTS = [
    "Project Atlas",
    "Project Heron",
    "Project Quill",
    "Project Ember",
    "Project Tidewater",
    "Project Lantern",
    "Project Sable",
    "Project Orchard",
]
FOODS = ["cortado", "flat white", "matcha latte", "oat milk cappuccino", "espresso", "chai"]
RESTAURANTS = [
    "Taberna da Rua",
    "Noodle Bar 88",
    "Casa Verde",
    "The Copper Pot",
    "Sushi Ren",
    "Le Petit Zinc",
]
BOOKS = [
    "The Pragmatic Programmer",
    "Designing Data-Intensive Applications",
    "Piranesi",
    "The Overstory",
    "Project Hail Mary",
    "Thinking in Systems",
]

# (domain, category, base importance range, template). Fields in braces are filled per memory.
TEMPLATES: list[tuple[str, str, tuple[float, float], str]] = [
    (
        "work",
        "episodic",
        (0.05, 0.35),
        "Had a standup with {person} about {project}; the {team} backlog is down to {n} tickets.",
    ),
    (
        "work",
        "episodic",
        (0.1, 0.45),
        "{person} asked {name} to review pull request #{pr} for {project} before {weekday}.",
    ),
    (
        "work",
        "semantic",
        (0.3, 0.7),
        "{project} uses Postgres 16 with {n} read replicas; the on-call rotation is owned by {person}.",
    ),
    (
        "work",
        "episodic",
        (0.05, 0.3),
        "Debugged a flaky test in {project} with {person}; it failed {n} times out of 200 runs.",
    ),
    (
        "work",
        "procedural",
        (0.4, 0.8),
        "To deploy {project}, {name} runs the release script, waits for {n} health checks, then tags v{major}.{minor}.",
    ),
    (
        "work",
        "episodic",
        (0.2, 0.6),
        "Order {order} for {n} new laptops for the {team} team was approved by {person} on {date}.",
    ),
    (
        "travel",
        "episodic",
        (0.1, 0.5),
        "{name} booked a flight to {place} on {date}, confirmation code {code}, seat {seat}.",
    ),
    (
        "travel",
        "episodic",
        (0.05, 0.3),
        "The hotel in {place} cost EUR {price} a night; {name} found the breakfast mediocre.",
    ),
    (
        "food",
        "semantic",
        (0.3, 0.7),
        "{name} prefers a {food} in the morning and avoids caffeine after 3 pm.",
    ),
    (
        "food",
        "episodic",
        (0.02, 0.25),
        "Dinner at {restaurant} with {person}; the bill was EUR {price} and they split it.",
    ),
    ("personal", "episodic", (0.05, 0.35), "{name} finished reading {book} and rated it {rating} out of 5."),
    (
        "personal",
        "episodic",
        (0.1, 0.5),
        "{person}'s birthday is on {date}; {name} plans to send a gift from {place}.",
    ),
    (
        "health",
        "episodic",
        (0.05, 0.4),
        "{name} ran {km} km along the river in {minutes} minutes; resting heart rate was {bpm} bpm.",
    ),
    (
        "health",
        "semantic",
        (0.4, 0.8),
        "{name} is allergic to penicillin; the doctor, {person}, noted it on {date}.",
    ),
    (
        "finance",
        "episodic",
        (0.05, 0.3),
        "Paid the electricity bill of EUR {price} for {month}; reference {code}.",
    ),
    (
        "finance",
        "semantic",
        (0.3, 0.7),
        "{name} moves {pct}% of each salary into the index fund on the {day}th of the month.",
    ),
    (
        "chat",
        "episodic",
        (0.0, 0.15),
        "Small talk: {name} mentioned the weather in {city} was {weather} and {n} degrees.",
    ),
    (
        "chat",
        "episodic",
        (0.0, 0.2),
        "{name} asked for a synonym for '{word}' while writing an email to {person}.",
    ),
]
CORE_FACTS = [
    "{name} lives in {city} and works on the {team} team.",
    "{name}'s manager is {person}; their 1:1 is every {weekday}.",
    "{name} wants answers short and with code examples first.",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
WEATHER = ["rainy", "sunny", "windy", "foggy", "cold", "humid"]
WORDS = ["important", "quickly", "happy", "difficult", "improve", "meeting"]


@dataclass(frozen=True)
class DemoMemory:
    id: uuid.UUID
    user_id: str
    content: str
    domain: str
    category: str
    importance_score: float
    access_count: int
    last_accessed_at: datetime | None
    created_at: datetime
    entity_links: list[uuid.UUID]
    metadata: dict


def generate_history(
    *,
    end: datetime | None = None,
    days: int = 540,
    per_day: tuple[int, int] = (50, 100),
    users: int = 4,
    seed: int = 7,
) -> Iterator[DemoMemory]:
    """Yield memories oldest first; `end` defaults to today 00:00 UTC (fixed within a day)."""
    if days < 1:
        raise ValueError(f"days={days} must be >= 1")
    if not 1 <= users <= len(USERS):
        raise ValueError(f"users={users} must be between 1 and {len(USERS)}")
    lo, hi = per_day
    if not 0 < lo <= hi:
        raise ValueError(f"per_day={per_day} must be 0 < low <= high")
    end = end or datetime.combine(datetime.now(UTC).date(), time(), UTC)
    rng = random.Random(seed)
    user_ids = list(USERS)[:users]
    start = end - timedelta(days=days)
    recent_by_user: dict[str, list[uuid.UUID]] = {u: [] for u in user_ids}
    for u in user_ids:  # identity-level facts, created on day one
        profile = USERS[u]
        for fact in CORE_FACTS:
            text = fact.format(person=rng.choice(PEOPLE), weekday=rng.choice(WEEKDAYS), **profile)
            yield _memory(rng, u, text, "profile", "core", 0.95, start, end, access=(20, 60))
    for day in range(days):
        day_start = start + timedelta(days=day)
        for _ in range(rng.randint(lo, hi)):
            user = rng.choice(user_ids)
            domain, category, (imp_lo, imp_hi), template = rng.choice(TEMPLATES)
            ts = day_start + timedelta(seconds=rng.randrange(86_400))
            text = template.format(**_fields(rng, USERS[user], ts))
            importance = round(rng.uniform(imp_lo, imp_hi), 3)
            if rng.random() < 0.05:  # a few routine memories turn out to matter
                importance = round(rng.uniform(0.6, 0.95), 3)
            mem = _memory(rng, user, text, domain, category, importance, ts, end, links=recent_by_user[user])
            recent_by_user[user] = (recent_by_user[user] + [mem.id])[-20:]
            yield mem


def _fields(rng: random.Random, profile: dict[str, str], ts: datetime) -> dict[str, object]:
    when = ts + timedelta(days=rng.randint(1, 60))
    return {
        **profile,
        "person": rng.choice(PEOPLE),
        "project": rng.choice(PROJECTS),
        "place": rng.choice(PLACES),
        "n": rng.randint(2, 48),
        "pr": rng.randint(1000, 9999),
        "weekday": rng.choice(WEEKDAYS),
        "major": rng.randint(1, 4),
        "minor": rng.randint(0, 30),
        "order": f"ORD-{rng.randint(1000, 9999)}",
        "date": when.strftime("%d %B %Y"),
        "code": "".join(rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZ23456789", k=6)),
        "seat": f"{rng.randint(1, 40)}{rng.choice('ABCDEF')}",
        "price": rng.randint(9, 420),
        "food": rng.choice(FOODS),
        "restaurant": rng.choice(RESTAURANTS),
        "book": rng.choice(BOOKS),
        "rating": rng.randint(1, 5),
        "km": round(rng.uniform(3, 21), 1),
        "minutes": rng.randint(18, 130),
        "bpm": rng.randint(48, 72),
        "month": ts.strftime("%B %Y"),
        "pct": rng.randint(5, 30),
        "day": rng.randint(1, 28),
        "weather": rng.choice(WEATHER),
        "word": rng.choice(WORDS),
    }


def _memory(
    rng: random.Random,
    user: str,
    text: str,
    domain: str,
    category: str,
    importance: float,
    created: datetime,
    end: datetime,
    *,
    access: tuple[int, int] | None = None,
    links: Sequence[uuid.UUID] = (),
) -> DemoMemory:
    age_days = (end - created).total_seconds() / 86_400
    # Access: important and recent memories get used; cold ones were touched once or twice, long ago.
    if access is None:
        expected = 6 * importance + (3 if age_days < 45 else 0)
        count = max(0, int(rng.gauss(expected, 1.5)))
    else:
        count = rng.randint(*access)
    last = None
    if count:
        recent_bias = importance > 0.5 or age_days < 45
        span = min(age_days, 30 if recent_bias else age_days)
        last = end - timedelta(days=rng.uniform(0, max(span, 0.01)))
        last = max(last, created)
    linked = rng.sample(links, k=min(len(links), rng.choice([0, 0, 1, 2]))) if links else []
    meta = {"source": rng.choice(["chat", "email", "calendar", "note"]), "turn": rng.randint(1, 400)}
    return DemoMemory(
        id=uuid.UUID(int=rng.getrandbits(128), version=4),
        user_id=user,
        content=text,
        domain=domain,
        category=category,
        importance_score=importance,
        access_count=count,
        last_accessed_at=last,
        created_at=created,
        entity_links=linked,
        metadata=meta,
    )
