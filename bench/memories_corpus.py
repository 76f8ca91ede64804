"""What the memories benchmark writes and asks: varied English memories, the queries of
varied selectivity run over them, and the fixed conversation the extractor reads.

Everything comes from seeded generators, so every run (and every database) sees the
same memories, queries and messages.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

DRINKS = [
    "espresso", "green tea", "oat milk lattes", "sparkling water", "black coffee", "chamomile tea",
    "orange juice", "red wine", "craft beer", "hot chocolate", "matcha", "cold brew", "lemonade",
    "rooibos", "kombucha", "flat whites", "iced tea", "cappuccino", "ginger ale", "mint tea",
]  # fmt: skip
FOODS = [
    "sushi", "ramen", "dark chocolate", "spicy curry", "sourdough bread", "mushroom risotto",
    "falafel", "pancakes", "tacos", "pho", "dumplings", "lasagna", "paella", "goat cheese",
    "blueberry muffins", "oatmeal", "grilled salmon", "pad thai", "croissants", "hummus",
    "shakshuka", "bibimbap", "pierogi", "ceviche", "gnocchi", "kimchi", "brisket", "baklava",
    "tiramisu", "gazpacho", "empanadas", "udon", "biryani", "moussaka", "churros", "poutine",
]  # fmt: skip
CITIES = [
    "Lisbon", "Berlin", "Kyoto", "Toronto", "Nairobi", "Oslo", "Porto", "Seville", "Krakow",
    "Melbourne", "Montreal", "Reykjavik", "Valparaiso", "Hanoi", "Tbilisi", "Bologna", "Ghent",
    "Ljubljana", "Marrakesh", "Osaka", "Vancouver", "Edinburgh", "Dublin", "Helsinki", "Tallinn",
    "Riga", "Vilnius", "Prague", "Vienna", "Budapest", "Zagreb", "Athens", "Istanbul", "Cairo",
    "Lagos", "Accra", "Dakar", "Bogota", "Lima", "Quito", "Santiago", "Cordoba", "Austin",
    "Denver", "Portland", "Chicago", "Boston", "Seattle", "Halifax", "Wellington",
]  # fmt: skip
HOBBIES = [
    "hiking", "bouldering", "knitting", "chess", "birdwatching", "sailing", "pottery", "running",
    "photography", "gardening", "woodworking", "yoga", "swimming", "cycling", "baking",
    "painting", "fishing", "skiing", "surfing", "board games", "crosswords", "calligraphy",
]  # fmt: skip
RELATIONS = [
    "sister", "brother", "mother", "father", "daughter", "son", "partner", "wife", "husband",
    "cousin", "manager", "neighbour", "best friend", "grandmother", "landlord", "dentist",
]  # fmt: skip
CHORES = [
    "ironing shirts", "doing the dishes", "vacuuming", "filing taxes", "mowing the lawn",
    "cleaning the oven", "folding laundry", "grocery shopping", "answering email",
]  # fmt: skip
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
DAYTIMES = ["morning", "afternoon", "evening", "night"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
]  # fmt: skip
HABITS = [
    "stretch for ten minutes", "check the weather", "write a to-do list", "walk the dog",
    "review pull requests", "call my parents", "back up my laptop", "water the plants",
    "read the news", "meditate", "plan the week", "take vitamins", "journal",
]  # fmt: skip
EVENTS = [
    "a long flight", "an important meeting", "a job interview", "a presentation", "bed",
    "work", "a race", "a deployment", "a dentist appointment", "the weekly standup",
]  # fmt: skip
TOOLS = [
    "PostgreSQL", "SQLite", "Django", "React", "Kubernetes", "Terraform", "Rust", "Python",
    "TypeScript", "Redis", "Kafka", "Figma", "Notion", "Linear", "Jira", "Grafana", "Svelte",
    "FastAPI", "Flutter", "Elixir", "Haskell", "Vim", "Emacs", "Neovim", "Docker", "Ansible",
]  # fmt: skip
COLOURS = ["red", "blue", "green", "yellow", "black", "white", "silver", "orange", "purple", "teal"]
THINGS = ["car", "bike", "front door", "kitchen", "phone case", "backpack", "umbrella", "sofa"]
PETS = ["dog", "cat", "parrot", "rabbit", "hamster", "tortoise", "goldfish"]
SYLLABLES = [
    "ka", "lo", "mi", "ra", "ten", "vi", "sa", "dor", "el", "an", "bri", "cos", "fa", "gu",
    "ho", "ju", "nel", "pra", "qui", "ros", "tha", "ul", "wen", "yas", "zo", "mar", "lin", "tes",
]  # fmt: skip


def name(n: int) -> str:
    """The n-th made-up given name (two syllables below 784, three from there): rare words."""
    count = len(SYLLABLES)
    first, second, third = n % count, (n // count) % count, (n // count // count) % count
    parts = SYLLABLES[first] + SYLLABLES[second] + (SYLLABLES[third] if n >= count * count else "")
    return parts.capitalize()


def project(n: int) -> str:
    """The n-th of 784 made-up project code names."""
    count = len(SYLLABLES)
    return (SYLLABLES[n % count] + SYLLABLES[(n // count) % count]).capitalize() + "ix"


#: How many names and projects the memories draw from.
NAMES, PROJECTS = 2000, 784

#: (type, sentence) pairs, as people state things and the extractor keeps them; each
#: ``{field}`` is filled with a fresh pick of :class:`Picks`.
TEMPLATES: list[tuple[str, str]] = [
    ("factual", "I prefer {drink} over {drink} in the {daytime}."),
    ("factual", "I love the {food} at a small place in {city}."),
    ("factual", "I really enjoy {hobby} with my {relation}."),
    ("factual", "I hate {chore} on {day}s."),
    ("procedural", "I always {habit} before {event}."),
    ("procedural", "I usually go {hobby} on {day} {daytime}s."),
    ("procedural", "I never drink {drink} after {hour} pm."),
    ("episodic", "We decided to move the {project} launch to {month}."),
    ("episodic", "I finally chose {tool} for the {project} rewrite."),
    ("episodic", "We agreed to meet {name} in {city} in {month}."),
    ("factual", "My {relation}'s name is {name}."),
    ("factual", "My {pet} is called {name} and is {age} years old."),
    ("factual", "My {thing} is {colour}."),
    ("factual", "My gym locker code is {code}."),
    ("semantic", "The {project} service runs on {tool} with {tool}."),
    ("semantic", "{tool} releases are tested in staging for {age} days first."),
    ("factual", "Remember that {name} is allergic to {food}."),
    ("factual", "Remember that the {project} deadline is {day} {date} {month}."),
]


class Picks(dict):
    """A template's fields, each looked up afresh: two ``{drink}`` are two picks."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.choices: dict[str, Callable[[], str]] = {
            "drink": lambda: rng.choice(DRINKS),
            "food": lambda: rng.choice(FOODS),
            "city": lambda: rng.choice(CITIES),
            "hobby": lambda: rng.choice(HOBBIES),
            "relation": lambda: rng.choice(RELATIONS),
            "chore": lambda: rng.choice(CHORES),
            "day": lambda: rng.choice(DAYS),
            "daytime": lambda: rng.choice(DAYTIMES),
            "month": lambda: rng.choice(MONTHS),
            "habit": lambda: rng.choice(HABITS),
            "event": lambda: rng.choice(EVENTS),
            "tool": lambda: rng.choice(TOOLS),
            "colour": lambda: rng.choice(COLOURS),
            "thing": lambda: rng.choice(THINGS),
            "pet": lambda: rng.choice(PETS),
            "name": lambda: name(rng.randrange(NAMES)),
            "project": lambda: project(rng.randrange(PROJECTS)),
            "hour": lambda: str(rng.randint(3, 11)),
            "age": lambda: str(rng.randint(2, 15)),
            "date": lambda: str(rng.randint(1, 28)),
            "code": lambda: str(rng.randint(1000, 9999)),
        }

    def __missing__(self, field: str) -> str:
        return self.choices[field]()


def sentence(rng: random.Random) -> tuple[str, str]:
    """A random template filled in: ``(type, text)``."""
    type_, template = rng.choice(TEMPLATES)
    return type_, template.format_map(Picks(rng))


TAILS = [
    "",
    "",
    " It has been like that for years.",
    " That came up again last week.",
    " Worth keeping in mind when planning trips.",
    " The whole team knows about it by now.",
]


def memory(n: int) -> tuple[str, str]:
    """The n-th memory: ``(type, content)``, the same on every run."""
    rng = random.Random(n)  # noqa: S311 - test data, not a secret
    type_, text = sentence(rng)
    return type_, text + rng.choice(TAILS)


#: The searches, by name: from a word no memory holds to a question most memories
#: match a word of. The counts each matches are measured and reported with the figures.
QUERIES = {
    "no match": "Anything on xylophones?",
    "rare name": f"Who is {name(458)}?",
    "one city": "Lisbon",
    "one food": "Where did I eat ramen?",
    "two words": "espresso Saturday",
    "broad question": "What do I usually drink in the morning before work?",
}


def conversation(n: int, messages: int) -> list[dict[str, Any]]:
    """The n-th conversation of the extraction corpus: ``messages`` alternating user and
    assistant messages (ids ``c{n}-m{i}``); about half the user's state something the
    rule-based extractor keeps, the rest are questions, hypotheticals and small talk."""
    r = random.Random(1_000_000 + n)  # noqa: S311 - test data, not a secret
    small_talk = [
        "Can you help me plan the week?",
        "What is the weather like in {city} today?",
        "If I went to {city}, would I need a visa?",
        "Thanks, that helps a lot.",
        "Hmm, let me think about it.",
        "I don't like {food} much.",
        "Could you summarise the {project} notes?",
    ]
    result = []
    for i in range(messages):
        if i % 2:
            text = f"Noted. Here is what I found about {r.choice(CITIES)} and {r.choice(HOBBIES)}."
            result.append({"id": f"c{n}-m{i}", "role": "assistant", "content": text})
            continue
        if r.random() < 0.5:
            text = sentence(r)[1]
        else:
            text = r.choice(small_talk).format(
                city=r.choice(CITIES), food=r.choice(FOODS), project=project(r.randrange(PROJECTS))
            )
        result.append({"id": f"c{n}-m{i}", "role": "user", "content": text})
    return result
