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

import math
import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

USERS = {
    "user-ada": {"name": "Ada", "city": "Lisbon", "team": "payments"},
    "user-bruno": {"name": "Bruno", "city": "Porto", "team": "search"},
    "user-chen": {"name": "Chen", "city": "Singapore", "team": "mobile"},
    "user-dara": {"name": "Dara", "city": "Dublin", "team": "data platform"},
}
# What each user is like, and the one change of their story (at a share of the history's days).
PROFILES: dict[str, dict[str, str]] = {
    "user-ada": {
        "poss": "her",
        "coffee": "flat white",
        "allergy": "penicillin",
        "wants": "answers short and with code examples first",
    },
    "user-bruno": {
        "poss": "his",
        "coffee": "cortado",
        "allergy": "peanuts",
        "wants": "the decision first, then the reasons",
    },
    "user-chen": {
        "poss": "his",
        "coffee": "oat milk cappuccino",
        "allergy": "shellfish",
        "wants": "bullet points rather than long paragraphs",
    },
    "user-dara": {
        "poss": "her",
        "coffee": "matcha latte",
        "allergy": "ibuprofen",
        "wants": "links to the sources with every answer",
    },
}
# (kind, new value, share of the history's days at which it happens)
CHANGES: dict[str, tuple[str, str, float]] = {
    "user-ada": ("city", "Porto", 0.55),
    "user-bruno": ("manager", "", 0.4),  # the new manager comes from the user's cast
    "user-chen": ("team", "growth", 0.6),
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
    "Ines Carvalho",
    "Marek Novak",
    "Aisha Bello",
    "Liam O'Brien",
    "Mei Tanaka",
    "Rafael Costa",
    "Nadia Petrova",
    "Samuel Mensah",
    "Elif Yilmaz",
    "Lars Nilsson",
    "Chloe Martin",
    "Arjun Mehta",
    "Zara Ahmed",
    "Felix Braun",
    "Grace Wong",
    "Mateo Silva",
    "Leah Cohen",
    "Viktor Horvat",
    "Noor Rahman",
    "Erik Johansson",
    "Camille Dubois",
    "Tariq Aziz",
    "Julia Kowalska",
    "Ravi Iyer",
    "Ana Ferreira",
    "Owen Hughes",
    "Sana Malik",
    "Pedro Santos",
    "Freya Campbell",
    "Kofi Asante",
    "Lena Fischer",
    "Hugo Moreau",
    "Yara Haddad",
    "Tomas Varga",
    "Irene Russo",
    "Daniel Park",
    "Beatriz Lima",
    "Stefan Ionescu",
    "Ruth Abebe",
    "Kai Jensen",
]
# A user's cast: the role of each person in that user's life (one person, one role; a role in
# UNIQUE_ROLES is held by one person at a time).
UNIQUE_ROLES = ("manager", "doctor", "dentist", "accountant", "mentor", "cousin")
SHARED_ROLES = {"colleague": 4, "friend": 3}
OTHER_TEAMS = ["identity", "billing", "infrastructure", "growth", "search", "payments", "risk", "mobile"]
PROJECTS = {
    "payments": ["Project Atlas", "Project Ledger"],
    "search": ["Project Heron", "Project Lantern"],
    "mobile": ["Project Quill", "Project Ember"],
    "growth": ["Project Orchard", "Project Beacon"],
    "data platform": ["Project Tidewater", "Project Sable"],
}
PLACES = [
    "Lisbon",
    "Porto",
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
    "Dublin",
    "Singapore",
    "Krakow",
    "Marrakesh",
    "Hanoi",
]
CLIMATE = {  # the year's mean temperature (°C), and how much warmer July is (January as much colder)
    "Lisbon": (18, 5),
    "Porto": (15, 5),
    "Singapore": (28, 1),
    "Dublin": (10, 5),
}
ROUTES = {
    "Lisbon": ["the Tagus riverside", "Monsanto park", "the Belem waterfront"],
    "Porto": ["the Douro riverside", "the Foz seafront", "Parque da Cidade"],
    "Singapore": ["East Coast Park", "the MacRitchie trails", "Marina Bay"],
    "Dublin": ["the Grand Canal", "Phoenix Park", "the Dun Laoghaire pier"],
}
RESTAURANTS = [
    "Taberna da Rua",
    "Noodle Bar 88",
    "Casa Verde",
    "The Copper Pot",
    "Sushi Ren",
    "Le Petit Zinc",
    "Mercado 31",
    "Osteria Nonna",
    "Blue Lotus",
    "The Fig Tree",
]
DISHES = [
    "grilled octopus",
    "a mushroom risotto",
    "laksa",
    "bacalhau",
    "ramen",
    "a lamb tagine",
    "dumplings",
    "a seafood rice",
    "a beetroot salad",
    "pad thai",
]
BOOKS = [
    ("The Pragmatic Programmer", 352),
    ("Designing Data-Intensive Applications", 616),
    ("Piranesi", 272),
    ("The Overstory", 512),
    ("Project Hail Mary", 496),
    ("Thinking in Systems", 240),
    ("The Remains of the Day", 258),
    ("Klara and the Sun", 303),
    ("A Philosophy of Software Design", 190),
    ("The Left Hand of Darkness", 304),
    ("Sapiens", 443),
    ("Station Eleven", 333),
    ("The Mythical Man-Month", 322),
    ("Circe", 393),
    ("Educated", 352),
    ("The Dispossessed", 387),
    ("Range", 339),
    ("Never Let Me Go", 288),
]
GIFTS = [
    "a scarf",
    "a cookbook",
    "concert tickets",
    "a plant",
    "a board game",
    "a bottle of port",
    "headphones",
]
CHANGES_SHIPPED = [
    "retry budgets for the webhook sender",
    "a faster checkout page",
    "the new audit log",
    "dark mode",
    "rate limits per API key",
    "a rewrite of the export job",
    "offline sync",
    "the CSV importer",
    "cursor pagination",
    "the new onboarding flow",
]
SYMPTOMS = [
    "p99 latency above 2 seconds",
    "a spike of 502s",
    "a full disk on a replica",
    "duplicate webhooks",
    "a stuck queue consumer",
    "expired TLS certificates",
]
FIXES = ["a rollback", "a config revert", "a failover to the replica", "a restart of the workers"]
TOPICS_1ON1 = [
    "the promotion case",
    "the roadmap for next quarter",
    "hiring for the team",
    "conference budget",
    "the on-call load",
    "a mentoring plan",
    "the team offsite",
    "feedback from the last review",
    "a transfer request",
    "the budget freeze",
    "training courses",
    "a difficult stakeholder",
]
UTILITIES = ["electricity", "water", "internet", "phone", "gas"]
WEATHER = ["rainy", "sunny", "windy", "foggy", "overcast", "humid", "clear"]
WORDS = ["important", "quickly", "happy", "difficult", "improve", "meeting", "problem", "help"]
LANGUAGES = ["Portuguese", "German", "Japanese", "Korean", "Spanish", "Irish", "Malay"]
PHRASES = ["see you tomorrow", "thank you for waiting", "where is the station", "the bill, please"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
# Details that make two memories of the same kind say different things (not only other numbers).
COMPONENTS = [
    "refund webhook",
    "reconciliation job",
    "fraud rules engine",
    "search indexer",
    "query parser",
    "push notification service",
    "image cache",
    "session store",
    "feature flag service",
    "billing exporter",
    "schema registry",
    "ingestion pipeline",
    "audit trail",
    "currency converter",
    "login page",
    "ranking model",
]
ABSENCES = [
    "sick",
    "at a conference",
    "on holiday",
    "on parental leave",
    "at a customer visit",
    "moving house",
]
PLANS = [
    "the picnic moved indoors",
    "the balcony plants got watered twice",
    "the bike stayed at home",
    "lunch was outside",
    "the windows stayed shut",
    "the laundry dried in an hour",
    "the ferry was cancelled",
    "the beach was packed",
    "an umbrella broke on the way",
    "the evening walk got shorter",
]
FAMILY_TOPICS = [
    "their grandmother's surgery",
    "a wedding in the spring",
    "the new puppy",
    "a job offer in Berlin",
    "the family reunion",
    "their old school closing",
    "a broken boiler",
    "a marathon they both signed up for",
]
SLEEP_NOTES = [
    "after a late incident call",
    "with the neighbours' party next door",
    "after an evening run",
    "with the window open",
    "after too much coffee",
    "with a new pillow",
    "after a long flight",
    "with earplugs",
]
FEELINGS = ["strong", "heavy-legged", "slow in the heat", "easy", "windblown", "fast on the way back"]
PODCASTS = [
    "urban planning",
    "jazz history",
    "distributed systems",
    "gardening",
    "chess",
    "the history of maps",
    "economics",
    "volcanoes",
    "product design",
    "classical music",
    "football tactics",
    "language learning",
]
CAFES = ["Cafe Lua", "the kiosk by the station", "Bean There", "the bakery on the corner", "Kaffeeklatsch"]
PURCHASES = [
    "a bike lock",
    "running shoes",
    "a desk lamp",
    "vitamins",
    "a rain jacket",
    "light bulbs",
    "a phone case",
    "a paperback",
    "a kettle",
    "sunscreen",
]
READING_NOTES = [
    "the chapter about the flood",
    "a slow middle part",
    "notes in the margin",
    "a twist nobody saw coming",
    "too many characters to track",
    "the best chapter so far",
    "a long footnote on history",
    "a dull stretch of dialogue",
]
TALKS = [
    "the payments meetup",
    "an internal tech talk",
    "a PyCon lightning talk",
    "the data summit",
    "a podcast guest slot",
]


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


def birthday(person: str, seed: int = 7) -> tuple[int, int]:
    """A person's one birthday (month, day): the same in every user's world and every year."""
    r = random.Random(f"{seed}:birthday:{person}")
    return r.randint(1, 12), r.randint(1, 28)


@dataclass
class _Life:
    """One user's world as the history goes: who is who, where they live, what they do and read."""

    user_id: str
    name: str
    poss: str
    city: str
    team: str
    cast: dict[str, list[str]]  # role -> people
    coffee: str
    allergy: str
    wants: str
    savings: tuple[int, int]  # % of the salary, day of the month
    books: list[tuple[str, int, int]]  # title, pages, the rating it gets when finished
    book: int = 0
    page: int = 0
    versions: dict[str, list[int]] = field(default_factory=dict)

    def one(self, role: str) -> str:
        return self.cast[role][0]

    @property
    def projects(self) -> list[str]:
        return PROJECTS[self.team]


def _lives(rng: random.Random, user_ids: Sequence[str], seed: int) -> dict[str, _Life]:
    people = list(PEOPLE)
    rng.shuffle(people)
    per_user = len(UNIQUE_ROLES) + sum(SHARED_ROLES.values())
    lives = {}
    for i, u in enumerate(user_ids):
        cast_people = people[i * per_user : (i + 1) * per_user]
        cast: dict[str, list[str]] = {role: [cast_people[j]] for j, role in enumerate(UNIQUE_ROLES)}
        rest = cast_people[len(UNIQUE_ROLES) :]
        for role, n in SHARED_ROLES.items():
            cast[role], rest = rest[:n], rest[n:]
        books = [(t, p, rng.randint(2, 5)) for t, p in rng.sample(BOOKS, len(BOOKS))]
        profile, base = PROFILES[u], USERS[u]
        lives[u] = _Life(
            u,
            base["name"],
            profile["poss"],
            base["city"],
            base["team"],
            cast,
            profile["coffee"],
            profile["allergy"],
            profile["wants"],
            (rng.choice([5, 10, 12, 15, 20]), rng.choice([1, 5, 10, 15, 25])),
            books,
        )
        for team_projects in PROJECTS.values():
            for p in team_projects:
                lives[u].versions[p] = [rng.randint(1, 4), rng.randint(0, 12)]
    return lives


# ------------------------------------------------------------------------------------------ events

# An event writes one memory: (domain, category, importance range, weight, its sentence).
_Writer = Callable[[random.Random, _Life, datetime], str]


def _code(rng: random.Random, k: int = 6) -> str:
    return "".join(rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZ23456789", k=k))


def _day(ts: datetime) -> str:
    return f"{ts:%B} {ts.day}"


def _soon(rng: random.Random, ts: datetime, lo: int = 1, hi: int = 30) -> str:
    return _day(ts + timedelta(days=rng.randint(lo, hi)))


def _clock(rng: random.Random) -> str:
    return f"{rng.randint(7, 21)}:{rng.choice(['00', '15', '30', '45', '10', '40', '50'])}"


def _pick(rng: random.Random, options: Sequence[str], **fields: object) -> str:
    return rng.choice(options).format(**fields)


def _standup(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "Standup with {c}: the {comp} in {p} is blocked on the {blocker}; {n} tickets left in the sprint.",
            "At standup {c} said moving the {comp} of {p} is {pct}% done; {key}-{t} needs a second pair of eyes.",
            "{name} and {c} went through the {p} board at standup: {n} tickets open, {key}-{t} ({comp}) in review.",
            "Short standup: {c} is {away} on {wd}, so {name} picks up {key}-{t} on the {comp}.",
        ],
        c=rng.choice(w.cast["colleague"]),
        p=(p := rng.choice(w.projects)),
        comp=rng.choice(COMPONENTS),
        away=rng.choice(ABSENCES),
        blocker=rng.choice(
            ["schema review", "security sign-off", "vendor API", "load test", "design review"]
        ),
        n=rng.randint(3, 40),
        pct=rng.randint(10, 95),
        key=p.split()[-1][:3].upper(),
        t=rng.randint(100, 2999),
        wd=rng.choice(WEEKDAYS),
        name=w.name,
    )


def _review(rng: random.Random, w: _Life, ts: datetime) -> str:
    c = rng.choice(w.cast["colleague"] + [w.one("manager")])
    return _pick(
        rng,
        [
            "{c} asked {name} to review pull request #{pr} on the {comp} of {p} before {wd}.",
            "{name} approved PR #{pr} from {c}: {change} in {p}.",
            "{name} left {n} comments on {c}'s PR #{pr}, mostly about {concern}.",
            "PR #{pr} ({change}) got merged after {name} and {c} paired on it for {h} hours.",
        ],
        c=c,
        pr=rng.randint(1000, 9999),
        p=w.projects[0] if c == w.one("manager") else rng.choice(w.projects),  # the manager leads the first
        wd=rng.choice(WEEKDAYS),
        name=w.name,
        change=rng.choice(CHANGES_SHIPPED),
        comp=rng.choice(COMPONENTS),
        n=rng.randint(2, 25),
        concern=rng.choice(["naming", "error handling", "missing tests", "lock ordering", "log noise"]),
        h=rng.randint(2, 6),
    )


def _incident(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "Incident INC-{i} on {p}: {symptom} for {m} minutes, fixed by {fix}.",
            "{name} was paged at {clock} for {symptom} in {p}; {c} took over after {m} minutes.",
            "The postmortem of INC-{i} is due {when}: {symptom} in {p}, {m} minutes of impact.",
        ],
        i=rng.randint(100, 999),
        p=rng.choice(w.projects),
        symptom=rng.choice(SYMPTOMS),
        m=rng.randint(4, 140),
        fix=rng.choice(FIXES),
        name=w.name,
        clock=_clock(rng),
        c=rng.choice(w.cast["colleague"]),
        when=_soon(rng, ts, 2, 9),
    )


def _release(rng: random.Random, w: _Life, ts: datetime) -> str:
    p = rng.choice(w.projects)
    version = w.versions[p]
    version[1] += 1  # releases only go up
    return _pick(
        rng,
        [
            "{p} v{v} shipped on {wd} with {change}.",
            "{name} tagged {p} v{v} after {n} green health checks; it brings {change}.",
            "Release notes for {p} v{v}: {change}, plus {n} bug fixes.",
        ],
        p=p,
        v=f"{version[0]}.{version[1]}.0",
        wd=rng.choice(WEEKDAYS),
        change=rng.choice(CHANGES_SHIPPED),
        name=w.name,
        n=rng.randint(2, 30),
    )


def _one_on_one(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "1:1 with {m}: talked about {topic}; next one on {when}.",
            "{m} and {name} spent their 1:1 on {topic} and agreed to revisit it on {when}.",
            "{m} approved expense report EXP-{n} of EUR {price} for {item}.",
            "{m} asked {name} for the {p} quarterly plan by {when}.",
        ],
        m=w.one("manager"),
        name=w.name,
        topic=rng.choice(TOPICS_1ON1),
        when=_soon(rng, ts, 5, 20),
        n=rng.randint(1000, 9999),
        price=rng.randint(20, 900),
        item=rng.choice(
            ["a conference ticket", "a team dinner", "a monitor", "train tickets", "a book order"]
        ),
        p=w.projects[0],
    )


def _flaky(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "Debugged a flaky test in {p} with {c}: test_{t} failed {n} times in 200 runs because of {cause}.",
            "{name} quarantined test_{t} in {p}; it times out {n}% of the time since {cause} crept in.",
        ],
        p=rng.choice(w.projects),
        c=rng.choice(w.cast["colleague"]),
        t=rng.choice(
            ["refund_flow", "index_rebuild", "login_retry", "export_csv", "sync_conflict", "rate_limit"]
        )
        + f"_{rng.randint(2, 99)}",
        n=rng.randint(2, 40),
        cause=rng.choice(["a shared temp dir", "clock skew", "an unordered set", "a race on startup", "DNS"]),
        name=w.name,
    )


def _mentor(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "{name} met {poss} mentor, {m}, on {today} for {n} minutes about {topic}.",
            "{name} sent {poss} mentor, {m}, a draft of the talk for {talk} on {when}.",
        ],
        name=w.name,
        poss=w.poss,
        m=w.one("mentor"),
        n=rng.choice([30, 45, 60, 90]),
        topic=rng.choice(
            ["public speaking", "staff engineer paths", "writing design docs", "saying no", "managing up"]
        ),
        talk=rng.choice(TALKS),
        when=_soon(rng, ts, 10, 40),
        today=_day(ts),
    )


def _flight(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "{name} booked a flight to {place} for {when}, confirmation code {code}, seat {seat}.",
            "Flight {air}{no} to {place} leaves at {clock} on {when}; {name} is in seat {seat}.",
            "{name} moved the {place} trip to {when}; the airline charged EUR {price} to change booking {code}.",
        ],
        name=w.name,
        place=rng.choice([p for p in PLACES if p != w.city]),
        when=_soon(rng, ts, 5, 60),
        code=_code(rng),
        seat=f"{rng.randint(1, 40)}{rng.choice('ABCDEF')}",
        air=rng.choice(["TP", "LH", "SQ", "EI", "KL", "FR"]),
        no=rng.randint(100, 2999),
        clock=_clock(rng),
        price=rng.randint(30, 250),
    )


def _hotel(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "The hotel in {place} cost EUR {price} a night; {name} found the breakfast {verdict}.",
            "Checked into {hotel} in {place}, room {room}, EUR {price} a night.",
            "{name} will avoid {hotel} in {place} next time: {complaint}.",
        ],
        place=rng.choice([p for p in PLACES if p != w.city]),
        price=rng.randint(60, 420),
        name=w.name,
        verdict=rng.choice(["mediocre", "excellent", "overpriced", "generous"]),
        hotel=rng.choice(
            ["Hotel Aurora", "the Harbour Inn", "Casa do Rio", "the Station Hotel", "Pension Mira"]
        ),
        room=rng.randint(101, 940),
        complaint=rng.choice(["thin walls", "no air conditioning", "a 40-minute check-in", "street noise"]),
    )


def _train(rng: random.Random, w: _Life, ts: datetime) -> str:
    return (
        f"Train from {w.city} to {rng.choice([p for p in PLACES if p != w.city])} on {_soon(rng, ts, 3, 40)}: "
        f"coach {rng.randint(1, 12)}, seat {rng.randint(1, 90)}, EUR {rng.randint(15, 140)}."
    )


def _coffee(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "{name} prefers {a} {coffee} in the morning and avoids caffeine after 3 pm; tea at the {clock2} meeting.",
            "{name} ordered the usual {coffee} at {cafe} on {wd}, EUR {price}.",
            "No coffee after 3 pm for {name}; the {coffee} at {clock} was the only one today.",
        ],
        name=w.name,
        coffee=w.coffee,
        a="an" if w.coffee[0] in "aeiou" else "a",
        cafe=rng.choice(CAFES),
        wd=rng.choice(WEEKDAYS),
        price=f"{rng.randint(2, 5)}.{rng.choice(['20', '40', '50', '80'])}",
        clock=f"{rng.randint(7, 10)}:{rng.randint(0, 59):02d}",
        clock2=f"{rng.randint(15, 18)}:{rng.randint(0, 59):02d}",
    )


def _dinner(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "Dinner at {r} with {f}; the bill was EUR {price} and they split it.",
            "{f} and {name} tried {dish} at {r}: worth going back, EUR {price} for two.",
            "Lunch with {f} at {r} on {wd}; {name} had {dish}.",
            "{name} booked a table for {n} at {r} on {when} at {clock}.",
        ],
        r=rng.choice(RESTAURANTS),
        f=rng.choice(w.cast["friend"]),
        price=rng.randint(18, 160),
        dish=rng.choice(DISHES),
        name=w.name,
        wd=rng.choice(WEEKDAYS),
        n=rng.randint(2, 8),
        when=_soon(rng, ts, 1, 14),
        clock=f"{rng.randint(19, 21)}:{rng.choice(['00', '30'])}",
    )


def _reading(rng: random.Random, w: _Life, ts: datetime) -> str:
    title, pages, rating = w.books[w.book % len(w.books)]
    w.page += rng.randint(15, 70)
    if w.page < pages:
        return _pick(
            rng,
            [
                "{name} is on page {page} of {title}: {note}.",
                "{name} read {title} on the train this morning, up to page {page} and {note}.",
            ],
            note=rng.choice(READING_NOTES),
            name=w.name,
            page=w.page,
            title=title,
        )
    w.book, w.page = w.book + 1, 0
    return f"{w.name} finished reading {title} ({pages} pages) and rated it {rating} out of 5."


def _family(rng: random.Random, w: _Life, ts: datetime) -> str:
    s = w.one("cousin")
    return _pick(
        rng,
        [
            "{name} called {poss} cousin, {s}, for {m} minutes about {topic}; {s} visits {city} on {when}.",
            "{s} sent {n} photos from the weekend in {place}; {name} promised to call back on {wd}.",
            "{name} and {s} are splitting the cost of {gift} for their grandmother, EUR {price} each.",
        ],
        poss=w.poss,
        s=s,
        m=rng.randint(5, 90),
        n=rng.randint(3, 40),
        topic=rng.choice(FAMILY_TOPICS),
        city=w.city,
        when=_soon(rng, ts, 5, 45),
        name=w.name,
        wd=rng.choice(WEEKDAYS),
        price=rng.randint(20, 150),
        place=rng.choice(PLACES),
        gift=rng.choice(GIFTS),
    )


def _run(rng: random.Random, w: _Life, ts: datetime) -> str:
    km = round(rng.uniform(3, 21), 1)
    minutes = round(km * rng.uniform(4.8, 6.8))
    pace = minutes * 60 / km
    return _pick(
        rng,
        [
            "{name} ran {km} km along {route} in {m} minutes and felt {feel}; resting heart rate was {bpm} bpm.",
            "Long run: {km} km on {route}, {m} minutes, average pace {pace} per km.",
            "{name} skipped the run on {route} because of a sore {part}; planned {km} km.",
        ],
        name=w.name,
        km=km,
        route=rng.choice(ROUTES[w.city]),
        m=minutes,
        bpm=rng.randint(48, 64),
        pace=f"{int(pace // 60)}:{int(pace % 60):02d}",
        part=rng.choice(["knee", "calf", "ankle", "hamstring", "hip", "foot"]),
        feel=rng.choice(FEELINGS),
    )


def _doctor(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "{name} is allergic to {allergy}; {poss} doctor, {d}, noted it on {when} with the {visit}.",
            "{name} saw {poss} doctor, {d}, on {when}: blood pressure {sys}/{dia}, all fine.",
            "{name} has a check-up with {poss} dentist, {dn}, on {when} at {clock}.",
            "{name} had a filling replaced by {poss} dentist, {dn}; EUR {price}, partly covered.",
        ],
        name=w.name,
        allergy=w.allergy,
        visit=rng.choice(
            ["flu shot", "travel vaccines", "annual check-up", "new prescription", "blood test"]
        ),
        poss=w.poss,
        d=w.one("doctor"),
        dn=w.one("dentist"),
        when=_soon(rng, ts, 1, 30),
        sys=rng.randint(108, 132),
        dia=rng.randint(68, 85),
        clock=_clock(rng),
        price=rng.randint(40, 260),
    )


def _sleep(rng: random.Random, w: _Life, ts: datetime) -> str:
    return (
        f"{w.name} slept {rng.randint(5, 8)}h{rng.randint(0, 59):02d} last night, "
        f"{rng.choice(['no', 'two', 'three', 'a few'])} wake-ups {rng.choice(SLEEP_NOTES)}; bedtime was {rng.randint(22, 23)}:{rng.randint(0, 59):02d}."
    )


def _bill(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "Paid the {u} bill of EUR {price} for {month}; reference {code}.",
            "The {u} bill for {month} came to EUR {price}, due {when} (reference {code}).",
        ],
        u=rng.choice(UTILITIES),
        price=rng.randint(12, 180),
        month=f"{ts:%B %Y}",
        code=_code(rng),
        when=_soon(rng, ts, 5, 20),
    )


def _money(rng: random.Random, w: _Life, ts: datetime) -> str:
    pct, day = w.savings
    return _pick(
        rng,
        [
            "{name} moves {pct}% of each salary into the index fund on the {day} of the month: EUR {saved} in {month}.",
            "{name} sent {poss} accountant, {a}, the {doc} for {year}; due {when}.",
            "Card payment of EUR {price} for {item} at {shop} on {today}.",
        ],
        name=w.name,
        pct=pct,
        day=f"{day}{'st' if day in (1, 21) else 'th'}",
        poss=w.poss,
        a=w.one("accountant"),
        doc=rng.choice(["tax receipts", "rental contract", "invoice list", "pension statement"]),
        year=ts.year,
        when=_soon(rng, ts, 7, 30),
        price=f"{rng.randint(3, 240)}.{rng.randint(0, 99):02d}",
        shop=rng.choice(
            ["the bookshop", "the pharmacy", "the hardware store", "the market", "the bike shop"]
        ),
        today=_day(ts),
        saved=rng.randint(150, 900),
        item=rng.choice(PURCHASES),
        month=f"{ts:%B}",
    )


def _weather(rng: random.Random, w: _Life, ts: datetime) -> str:
    mean, swing = CLIMATE[w.city]
    degrees = round(mean + swing * math.cos((ts.month - 7) / 6 * math.pi)) + rng.randint(-3, 3)
    weather = rng.choice(WEATHER)
    return _pick(
        rng,
        [
            "Small talk: {name} mentioned the weather in {city} was {weather} and {deg} degrees, so {plan}.",
            "{weather_cap} {wd} in {city}, {deg} degrees; {name} worked from home and {plan}.",
            "{name} said it was {deg} degrees and {weather} in {city} at {clock}; {plan}.",
        ],
        name=w.name,
        city=w.city,
        weather=weather,
        weather_cap=weather.capitalize(),
        deg=degrees,
        wd=ts.strftime("%A"),
        clock=_clock(rng),
        plan=rng.choice(PLANS),
    )


def _chat(rng: random.Random, w: _Life, ts: datetime) -> str:
    return _pick(
        rng,
        [
            "{name} asked for a synonym for '{word}' while writing an email to {c} about {subject}.",
            "{name} wanted a better word than '{word}' for a message to {c} about {subject}.",
            "{name} asked how to say '{phrase}' in {lang} before the trip on {when}.",
            "{name} asked for a podcast about {topic} for the {m}-minute commute to {dest}.",
        ],
        name=w.name,
        word=rng.choice(WORDS),
        subject=rng.choice(
            [
                "the offsite",
                "a late invoice",
                "the new hire",
                "the holiday rota",
                "a conference talk",
                "moving dates",
            ]
        ),
        c=rng.choice(w.cast["colleague"] + w.cast["friend"]),
        phrase=rng.choice(PHRASES),
        lang=rng.choice(LANGUAGES),
        when=_soon(rng, ts, 3, 30),
        topic=rng.choice(PODCASTS),
        dest=rng.choice(["the office", "the gym", "the airport", "a client site", "the coast"]),
        m=rng.randint(15, 55),
    )


# (domain, category, importance range, weight, writer)
EVENTS: list[tuple[str, str, tuple[float, float], int, _Writer]] = [
    ("work", "episodic", (0.05, 0.35), 8, _standup),
    ("work", "episodic", (0.1, 0.45), 7, _review),
    ("work", "episodic", (0.2, 0.6), 3, _incident),
    ("work", "procedural", (0.4, 0.8), 3, _release),
    ("work", "episodic", (0.2, 0.6), 4, _one_on_one),
    ("work", "episodic", (0.05, 0.3), 4, _flaky),
    ("work", "episodic", (0.1, 0.4), 2, _mentor),
    ("travel", "episodic", (0.1, 0.5), 4, _flight),
    ("travel", "episodic", (0.05, 0.3), 3, _hotel),
    ("travel", "episodic", (0.05, 0.3), 2, _train),
    ("food", "semantic", (0.3, 0.7), 3, _coffee),
    ("food", "episodic", (0.02, 0.25), 5, _dinner),
    ("personal", "episodic", (0.05, 0.35), 3, _reading),
    ("personal", "episodic", (0.05, 0.4), 3, _family),
    ("health", "episodic", (0.05, 0.4), 5, _run),
    ("health", "semantic", (0.4, 0.8), 3, _doctor),
    ("health", "episodic", (0.02, 0.2), 2, _sleep),
    ("finance", "episodic", (0.05, 0.3), 4, _bill),
    ("finance", "semantic", (0.3, 0.7), 3, _money),
    ("chat", "episodic", (0.0, 0.15), 5, _weather),
    ("chat", "episodic", (0.0, 0.2), 5, _chat),
]
_WEIGHTS = [e[3] for e in EVENTS]


def _core_facts(w: _Life) -> list[str]:
    return [
        f"{w.name} lives in {w.city}.",
        f"{w.name} works on the {w.team} team.",
        f"{w.name}'s manager is {w.one('manager')}; their 1:1 is every {WEEKDAYS[len(w.name) % 5]}.",
        f"{w.name} wants {w.wants}.",
    ]


def _birthdays(rng: random.Random, lives: dict[str, _Life], first: date, last: date, seed: int) -> dict:
    """The day each birthday reminder comes, a few days before the birthday, once a year per person (the
    manager's birthday is on the team calendar from the first day instead)."""
    due: dict[date, list[tuple[str, str]]] = {}
    for u, w in lives.items():
        for role, people in w.cast.items():
            for person in people if role != "manager" else []:
                month, day = birthday(person, seed)
                lead = rng.randint(1, 6)
                for year in range(first.year, last.year + 2):
                    when = date(year, month, day) - timedelta(days=lead)
                    if first <= when <= last:
                        due.setdefault(when, []).append((u, person))
    return due


def _team_calendar(rng: random.Random, w: _Life, ts: datetime, seed: int) -> str:
    manager = w.one("manager")
    month, day = birthday(manager, seed)
    return f"{manager}'s birthday is on {date(2000, month, day):%B} {day}; the {w.team} team signs a card the week before."


def _birthday_text(rng: random.Random, w: _Life, ts: datetime, person: str, seed: int) -> str:
    month, day = birthday(person, seed)
    when = f"{date(2000, month, day):%B} {day}"
    role = next(r for r, people in w.cast.items() if person in people)
    return _pick(
        rng,
        [
            "{p}'s birthday is on {when}; {name} ordered {gift} for them (EUR {price}).",
            "Reminder for {name}: {p}'s birthday is on {when}, get {gift}.",
        ],
        p=person,
        when=when,
        name=w.name,
        gift=rng.choice(GIFTS) if role != "manager" else "a card from the team",
        price=rng.randint(15, 90),
    )


def _change(rng: random.Random, w: _Life, ts: datetime) -> str:
    """The user's one change, stated as a change (the old value named), applied to the world."""
    kind, value, _ = CHANGES[w.user_id]
    if kind == "city":
        old, w.city = w.city, value
        return (
            f"{w.name} moved to {value} from {old} on {_day(ts)}; the new flat is EUR "
            f"{rng.randint(900, 1400)} a month."
        )
    if kind == "manager":
        old, new = w.one("manager"), w.cast["colleague"].pop(0)
        w.cast["manager"], w.cast["former manager"] = [new], [old]
        other = next(t for t in OTHER_TEAMS if t != w.team)
        return f"Reorg: {w.name}'s manager is {new} from {_day(ts)}, taking over from {old}, who joins the {other} team."
    old, w.team = w.team, value
    return f"{w.name} works on the {value} team from {_day(ts)}, after {rng.randint(2, 5)} years on the {old} team."


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
    lives = _lives(rng, user_ids, seed)
    reminders = _birthdays(rng, lives, start.date(), (end - timedelta(days=1)).date(), seed)
    change_day = {u: int(days * CHANGES[u][2]) for u in user_ids if u in CHANGES}
    recent_by_user: dict[str, list[uuid.UUID]] = {u: [] for u in user_ids}
    for u in user_ids:  # identity-level facts, created on day one
        for text in _core_facts(lives[u]):
            yield _memory(rng, u, text, "profile", "core", 0.95, start, end, access=(20, 60))
    for day in range(days):
        day_start = start + timedelta(days=day)
        n = rng.randint(lo, hi)
        # Scheduled first (a birthday reminder, a user's change), then the day's routine.
        # (user, domain, category, importance, writer, the writer's arguments after rng, life, ts)
        planned: list[tuple[str, str, str, float, Callable[..., str], tuple[object, ...]]] = []
        for u, person in reminders.get(day_start.date(), []):
            planned.append((u, "personal", "episodic", rng.uniform(0.3, 0.6), _birthday_text, (person, seed)))
        if day == 0:
            for u in user_ids:
                planned.append((u, "work", "episodic", rng.uniform(0.1, 0.3), _team_calendar, (seed,)))
        for u in [u for u, d in change_day.items() if d == day]:
            planned.append((u, "profile", "semantic", 0.9, _change, ()))
        for i in range(n):
            # What is planned happens in the day's first hour: the rest of the day already sees a change.
            ts = day_start + timedelta(seconds=rng.randrange(3_600 if i < len(planned) else 86_400))
            if i < len(planned):
                user, domain, category, importance, write, args = planned[i]
                text = write(rng, lives[user], ts, *args)
                importance = round(importance, 3)
            else:
                user = rng.choice(user_ids)
                domain, category, (imp_lo, imp_hi), _, writer = rng.choices(EVENTS, weights=_WEIGHTS)[0]
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
