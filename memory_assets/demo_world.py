"""The demo's world (memory_assets.demo_data): its users, the people in their lives, places, projects and
the details events draw from, and each user's world as the history goes (Life).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def birthday(person: str, seed: int = 7) -> tuple[int, int]:
    """A person's one birthday (month, day): the same in every user's world and every year."""
    r = random.Random(f"{seed}:birthday:{person}")
    return r.randint(1, 12), r.randint(1, 28)


@dataclass
class Life:
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


def make_lives(rng: random.Random, user_ids: Sequence[str], seed: int) -> dict[str, Life]:
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
        lives[u] = Life(
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
