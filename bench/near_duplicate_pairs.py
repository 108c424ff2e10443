"""A small labelled set of memory pairs for calibrating the write path's near-duplicate rule
(memory_lib.near_duplicates), written for this project (no third-party text).

Labels:
* paraphrase: the same fact in other words; the second text must land on the first memory (merged, or
  superseding it: either way one live memory).
* changed: the same slot with a new value; the second must supersede the first.
* related: the same topic, a different fact; both must stay live.
* unrelated: nothing in common; both must stay live.
"""

from __future__ import annotations

PAIRS: list[tuple[str, str, str]] = [
    # paraphrase
    ("paraphrase", "User prefers a cortado in the morning", "In the morning the user prefers a cortado"),
    ("paraphrase", "The user's daughter is called Ines", "The user has a daughter called Ines"),
    ("paraphrase", "User works as a nurse at the city hospital", "User is a nurse working at the city hospital"),
    ("paraphrase", "User is allergic to peanuts", "The user has an allergy to peanuts"),
    ("paraphrase", "User's favourite band is Radiohead", "Radiohead is the user's favourite band"),
    ("paraphrase", "The user lives in Porto", "User lives in the city of Porto"),
    ("paraphrase", "User runs 5 km every Saturday", "Every Saturday the user runs 5 km"),
    ("paraphrase", "User's car is a blue Toyota Corolla", "The user drives a blue Toyota Corolla"),
    ("paraphrase", "The user is learning to play the cello", "User is learning the cello"),
    ("paraphrase", "User's wifi router is in the hallway", "The wifi router of the user is in the hallway"),
    ("paraphrase", "The team standup is at 9:30 on weekdays", "On weekdays the team standup is at 9:30"),
    ("paraphrase", "User's cat is named Miso", "The user has a cat named Miso"),
    # changed value
    ("changed", "User prefers a cortado in the morning", "User prefers a flat white in the morning"),
    ("changed", "The user lives in Porto", "The user lives in Lisbon"),
    ("changed", "User's favourite band is Radiohead", "User's favourite band is Portishead"),
    ("changed", "User works as a nurse at the city hospital", "User works as a teacher at the city school"),
    ("changed", "The team standup is at 9:30 on weekdays", "The team standup is at 10:00 on weekdays"),
    ("changed", "User runs 5 km every Saturday", "User runs 10 km every Saturday"),
    ("changed", "User's car is a blue Toyota Corolla", "User's car is a red Honda Civic"),
    ("changed", "User's cat is named Miso", "User's cat is named Tofu"),
    ("changed", "The monthly budget for groceries is 400 EUR", "The monthly budget for groceries is 450 EUR"),
    ("changed", "User likes cilantro", "User does not like cilantro"),
    ("changed", "The user's manager is Priya", "The user's manager is Tomasz"),
    ("changed", "User's dentist appointment is on Tuesday", "User's dentist appointment is on Thursday"),
    # related: same topic, another fact
    ("related", "User prefers a cortado in the morning", "User drinks green tea in the evening"),
    ("related", "User's cat is named Miso", "User's dog is named Pepper"),
    ("related", "The user lives in Porto", "The user's sister lives in Madrid"),
    ("related", "User runs 5 km every Saturday", "User swims on Wednesday evenings"),
    ("related", "User is allergic to peanuts", "User avoids gluten for digestion"),
    ("related", "User's favourite band is Radiohead", "User saw Bjork live in 2019"),
    ("related", "The team standup is at 9:30 on weekdays", "The sprint review is every second Friday"),
    ("related", "User's car is a blue Toyota Corolla", "User's bicycle is a green gravel bike"),
    ("related", "User works as a nurse at the city hospital", "User's partner works at the city library"),
    ("related", "The monthly budget for groceries is 400 EUR", "The rent is 900 EUR a month"),
    ("related", "User likes cilantro", "User likes chess"),
    ("related", "ORD-4471 refund requested", "ORD-4147 refund requested"),
    ("related", "Ana's birthday is on 3 May", "Rui's birthday is on 3 May"),
    ("related", "Invoice 2291 was paid by bank transfer", "Invoice 2297 was paid by bank transfer"),
    ("related", "User's brother lives in Berlin", "User's brother works in Berlin"),
    ("related", "User prefers a cortado in the morning", "User prefers a quiet desk in the office"),
    # unrelated
    ("unrelated", "User prefers a cortado in the morning", "The user's passport expires in March 2027"),
    ("unrelated", "User's cat is named Miso", "The quarterly report is due on the 15th"),
    ("unrelated", "The user lives in Porto", "User is learning to play the cello"),
    ("unrelated", "User runs 5 km every Saturday", "The wifi password was changed last week"),
    ("unrelated", "User is allergic to peanuts", "The team uses PostgreSQL for billing"),
    ("unrelated", "User's favourite band is Radiohead", "User's mortgage rate is fixed until 2030"),
    ("unrelated", "The team standup is at 9:30 on weekdays", "User's grandmother was born in Braga"),
    ("unrelated", "User's car is a blue Toyota Corolla", "User prefers window seats on flights"),
]

SAME_FACT = frozenset({"paraphrase", "changed"})  # one live memory afterwards
