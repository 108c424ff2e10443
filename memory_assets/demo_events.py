"""The demo's events (memory_assets.demo_data): each writes one memory of a user's day, in many phrasings
with details drawn per memory; the scheduled ones (core facts, birthday reminders, the team calendar, a
user's one change) come on their day, the routine ones by weight (EVENTS, WEIGHTS).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta

from memory_assets.demo_world import (
    ABSENCES,
    CAFES,
    CHANGES,
    CHANGES_SHIPPED,
    CLIMATE,
    COMPONENTS,
    DISHES,
    FAMILY_TOPICS,
    FEELINGS,
    FIXES,
    GIFTS,
    LANGUAGES,
    OTHER_TEAMS,
    PHRASES,
    PLACES,
    PLANS,
    PODCASTS,
    PURCHASES,
    READING_NOTES,
    RESTAURANTS,
    ROUTES,
    SLEEP_NOTES,
    SYMPTOMS,
    TALKS,
    TOPICS_1ON1,
    UTILITIES,
    WEATHER,
    WEEKDAYS,
    WORDS,
    Life,
    birthday,
)

# ------------------------------------------------------------------------------------------ events

# An event writes one memory: (domain, category, importance range, weight, its sentence).
Writer = Callable[[random.Random, Life, datetime], str]


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


def _standup(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _review(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _incident(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _release(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _one_on_one(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _flaky(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _mentor(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _flight(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _hotel(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _train(rng: random.Random, w: Life, ts: datetime) -> str:
    return (
        f"Train from {w.city} to {rng.choice([p for p in PLACES if p != w.city])} on {_soon(rng, ts, 3, 40)}: "
        f"coach {rng.randint(1, 12)}, seat {rng.randint(1, 90)}, EUR {rng.randint(15, 140)}."
    )


def _coffee(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _dinner(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _reading(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _family(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _run(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _doctor(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _sleep(rng: random.Random, w: Life, ts: datetime) -> str:
    return (
        f"{w.name} slept {rng.randint(5, 8)}h{rng.randint(0, 59):02d} last night, "
        f"{rng.choice(['no', 'two', 'three', 'a few'])} wake-ups {rng.choice(SLEEP_NOTES)}; bedtime was {rng.randint(22, 23)}:{rng.randint(0, 59):02d}."
    )


def _bill(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _money(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _weather(rng: random.Random, w: Life, ts: datetime) -> str:
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


def _chat(rng: random.Random, w: Life, ts: datetime) -> str:
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
EVENTS: list[tuple[str, str, tuple[float, float], int, Writer]] = [
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
WEIGHTS = [e[3] for e in EVENTS]


def core_facts(w: Life) -> list[str]:
    return [
        f"{w.name} lives in {w.city}.",
        f"{w.name} works on the {w.team} team.",
        f"{w.name}'s manager is {w.one('manager')}; their 1:1 is every {WEEKDAYS[len(w.name) % 5]}.",
        f"{w.name} wants {w.wants}.",
    ]


def birthday_reminders(
    rng: random.Random, lives: dict[str, Life], first: date, last: date, seed: int
) -> dict:
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


def team_calendar(rng: random.Random, w: Life, ts: datetime, seed: int) -> str:
    manager = w.one("manager")
    month, day = birthday(manager, seed)
    return f"{manager}'s birthday is on {date(2000, month, day):%B} {day}; the {w.team} team signs a card the week before."


def birthday_text(rng: random.Random, w: Life, ts: datetime, person: str, seed: int) -> str:
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


def change(rng: random.Random, w: Life, ts: datetime) -> str:
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
