"""A deterministic, realistic multi-user agent memory history, in a coherent world.

Several users, ~18 months of memories, 50-100 a day across users, with names, places, projects,
numbers and dates. Importance and access follow the storage tiers: most memories are routine and
go cold (low importance, rarely used), a minority stays warm, a few are core facts used often.
The same arguments always give the same memories (ids, text, timestamps and scores).

The world holds together, so the facts consolidation extracts from it do not contradict each other:
each person has one birthday (a reminder comes a few days before it each year; the manager's is on the
team calendar from the first day) and, in a user's life, one role (manager, doctor, dentist, accountant,
mentor, cousin, colleague, friend); the manager's work is the team's first project; a user's city, team
and manager change only by a memory that states the change and names the old value ("Ada moved to Porto
from Lisbon ..."), never by two memories that disagree; preferences, allergies and savings rules stay the
same; release versions only go up; a book is read page by page, then finished. The sentences come from
many phrasings of each kind of event with the details (ticket and PR numbers, amounts, codes, times)
drawn per memory, so two memories rarely say the same thing in the same words.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

import numpy as np

from memory_assets.demo_events import (
    EVENTS,
    WEIGHTS,
    birthday_reminders,
    birthday_text,
    change,
    core_facts,
    team_calendar,
)
from memory_assets.demo_world import CHANGES, USERS, birthday, make_lives
from memory_lib.core.models import NewMemory

__all__ = ["DemoMemory", "birthday", "generate_history"]


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

    def as_new_memory(self, embedding: np.ndarray, embedding_model: str) -> NewMemory:
        """This memory as a row to insert (memory_lib.storage.store.insert_memories), with its vector."""
        return NewMemory(
            id=self.id,
            user_id=self.user_id,
            content=self.content,
            embedding=embedding,
            embedding_model=embedding_model,
            entity_links=self.entity_links,
            metadata=self.metadata,
            domain=self.domain,
            category=self.category,
            importance_score=self.importance_score,
            access_count=self.access_count,
            last_accessed_at=self.last_accessed_at,
            created_at=self.created_at,
        )


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
    lives = make_lives(rng, user_ids, seed)
    reminders = birthday_reminders(rng, lives, start.date(), (end - timedelta(days=1)).date(), seed)
    change_day = {u: int(days * CHANGES[u][2]) for u in user_ids if u in CHANGES}
    recent_by_user: dict[str, list[uuid.UUID]] = {u: [] for u in user_ids}
    for u in user_ids:  # identity-level facts, created on day one
        for text in core_facts(lives[u]):
            yield _memory(rng, u, text, "profile", "core", 0.95, start, end, access=(20, 60))
    for day in range(days):
        day_start = start + timedelta(days=day)
        n = rng.randint(lo, hi)
        # Scheduled first (a birthday reminder, a user's change), then the day's routine.
        # (user, domain, category, importance, writer, the writer's arguments after rng, life, ts)
        planned: list[tuple[str, str, str, float, Callable[..., str], tuple[object, ...]]] = []
        for u, person in reminders.get(day_start.date(), []):
            planned.append((u, "personal", "episodic", rng.uniform(0.3, 0.6), birthday_text, (person, seed)))
        if day == 0:
            for u in user_ids:
                planned.append((u, "work", "episodic", rng.uniform(0.1, 0.3), team_calendar, (seed,)))
        for u in [u for u, d in change_day.items() if d == day]:
            planned.append((u, "profile", "semantic", 0.9, change, ()))
        for i in range(n):
            # What is planned happens in the day's first hour: the rest of the day already sees a change.
            ts = day_start + timedelta(seconds=rng.randrange(3_600 if i < len(planned) else 86_400))
            if i < len(planned):
                user, domain, category, importance, write, args = planned[i]
                text = write(rng, lives[user], ts, *args)
                importance = round(importance, 3)
            else:
                user = rng.choice(user_ids)
                domain, category, (imp_lo, imp_hi), _, writer = rng.choices(EVENTS, weights=WEIGHTS)[0]
                text = writer(rng, lives[user], ts)
                importance = round(rng.uniform(imp_lo, imp_hi), 3)
                if rng.random() < 0.05:  # a few routine memories turn out to matter
                    importance = round(rng.uniform(0.6, 0.95), 3)
            mem = _memory(rng, user, text, domain, category, importance, ts, end, links=recent_by_user[user])
            recent_by_user[user] = (recent_by_user[user] + [mem.id])[-20:]
            yield mem


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
