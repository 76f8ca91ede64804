"""A rule-based extractor of English statements of preference, decision and habit.

No model: regular expressions over each sentence of what a person said: the user's
messages, and those of a named speaker on either side (see :func:`speaker`). What it keeps
is the speaker's own sentence (whitespace normalized, capped at :data:`MAX_CHARS`, after
the speaker's name when the message has one), never a paraphrase, so a fact is not
silently rewritten; its key is derived from the category, the speaker's name and what
the statement is about, so "I love tea" then "I hate tea" update one memory.
Questions, hypotheticals ("if I ...", "I would ...") and negations other than "never"
("I don't like ...", ambiguous about what is liked instead) yield nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from persistent_memory.memories.extraction.candidates import Candidate

#: The longest sentence kept (characters); longer ones are cut at a word.
MAX_CHARS = 300
#: The longest "about" part a key is made of.
MAX_KEY_WORDS = 8

_SENTENCES = re.compile(r"[^.!?;\n]+[.!?]*")
_QUESTION_START = re.compile(
    r"^(do|does|did|what|how|can|could|should|shall|is|are|am|was|were|why|when|where|which|who|"
    r"whom|whose|would|will|may|might|have|has)\b",
    re.IGNORECASE,
)
# Hypotheticals and hedges: nothing stated as a fact.
_HYPOTHETICAL = re.compile(
    r"\b(if|unless|would|wouldn't|could|might|maybe|perhaps|suppose|supposing|imagine|wish|"
    r"hypothetically|sometimes|someday)\b|\bI'd\b",
    re.IGNORECASE,
)
_NEGATION = re.compile(r"\b(not|no longer|no|n't)\b|n't\b", re.IGNORECASE)
_SAID_OF_OTHERS = re.compile(r"\b(he|she|they|you|someone|people)\s+(said|says|thinks?)\b", re.IGNORECASE)

_I = r"(?:^|[,:]\s*|\band\s+|\bbut\s+|\bso\s+|\bhonestly,?\s+|\bwell,?\s+)"
RULES: list[tuple[str, str, re.Pattern[str]]] = [
    (
        "preference",
        "factual",
        re.compile(
            _I + r"I\s+(?:really\s+|strongly\s+|generally\s+|much\s+|absolutely\s+)?"
            r"(?P<verb>prefer|like|love|enjoy|hate|dislike|adore|detest)\s+(?P<about>.+)",
            re.IGNORECASE,
        ),
    ),
    (
        "habit",
        "procedural",
        re.compile(
            _I + r"I\s+(?P<verb>always|usually|normally|typically|generally|never|often)\s+(?P<about>.+)",
            re.IGNORECASE,
        ),
    ),
    (
        "decision",
        "episodic",
        re.compile(
            _I + r"(?:we|I)(?:'ve|\s+have|\s+just|\s+finally)*\s+(?P<verb>decided|agreed|chose)\s+"
            r"(?:to\s+|that\s+|on\s+)?(?P<about>.+)",
            re.IGNORECASE,
        ),
    ),
    (
        "fact",
        "factual",
        re.compile(
            _I + r"my\s+(?P<about>[a-z][a-z' -]{0,40}?)\s+(?P<verb>is|are)\s+(?P<value>.+)",
            re.IGNORECASE,
        ),
    ),
    (
        "note",
        "factual",
        re.compile(r"^(?:please\s+)?remember\s+(?:that\s+)?(?P<about>.+)", re.IGNORECASE),
    ),
]

_KEY_UNSAFE = re.compile(r"[^a-z0-9]+")
_SPACES = re.compile(r"\s+")


def normalize_content(text: str) -> str:
    """Whitespace collapsed, ends trimmed (as the service stores content)."""
    return _SPACES.sub(" ", text).strip()


def _key(category: str, about: str) -> str:
    words = _KEY_UNSAFE.sub(" ", about.casefold()).split()
    while words and words[0] in ("the", "a", "an", "to", "my", "our"):
        words = words[1:]
    slug = "-".join(words[:MAX_KEY_WORDS])[:120].strip("-")
    return f"{category}.{slug or 'statement'}"


_EMPTY_OBJECTS = frozenset(("you", "it", "that", "this", "them", "him", "her", "those", "these"))
_CONNECTIVE = re.compile(r"^(and|but|so|also|oh|well|honestly|anyway)\b[,]?\s+", re.IGNORECASE)


def _cap(sentence: str) -> str:
    sentence = normalize_content(sentence)
    while _CONNECTIVE.match(sentence):
        sentence = _CONNECTIVE.sub("", sentence, count=1)
    if len(sentence) > MAX_CHARS:
        sentence = sentence[:MAX_CHARS].rsplit(" ", 1)[0].rstrip(",;:") + "…"
    sentence = sentence[0].upper() + sentence[1:]
    return sentence if sentence[-1] in ".!…" else sentence + "."


def statements(text: str) -> Iterable[str]:
    """The sentences of ``text`` that state something (questions and hypotheticals left out)."""
    for match in _SENTENCES.finditer(text):
        sentence = normalize_content(match.group())
        if not sentence or sentence.endswith("?") or _QUESTION_START.match(sentence):
            continue
        if _HYPOTHETICAL.search(sentence) or _SAID_OF_OTHERS.search(sentence):
            continue
        yield sentence.rstrip(".!")


#: A word every rule needs (I, we, my, remember): a sentence without one is passed over
#: before the rules, whose patterns cost a hundred times more on a sentence they miss.
_ANY_RULE = re.compile(r"\b(?:I|we|my|remember)\b", re.IGNORECASE)


def extract_text(text: str) -> list[tuple[str, str, str]]:
    """``(key, type, content)`` of each statement in ``text`` a rule matches."""
    found: list[tuple[str, str, str]] = []
    if not _ANY_RULE.search(text):
        return found
    for sentence in statements(text):
        if not _ANY_RULE.search(sentence):
            continue
        for category, type_, pattern in RULES:
            match = pattern.search(sentence)
            if match is None:
                continue
            verb = (match.groupdict().get("verb") or "").casefold()
            if _NEGATION.search(sentence) and verb != "never":
                break  # "I don't like X", "my car is not red": ambiguous, left out
            about = match.group("about")
            if about.casefold().strip(" .!") in _EMPTY_OBJECTS:
                break  # "I love you", "I like that": about nothing that lasts
            if category == "fact":
                about = f"my {about}"
            found.append((_key(category, about), type_, _cap(sentence)))
            break
    return found


def speaker(message: dict[str, Any]) -> str | None:
    """Who said ``message`` as far as the rules are concerned: ``""`` for the user, the
    message's ``name`` for a named speaker (a person on either side of a recorded
    conversation), None for a message whose statements are not about a person (an
    unnamed assistant speaks of itself: "I always check the docs")."""
    name = message.get("name")
    named = name.strip() if isinstance(name, str) else ""
    if message.get("role") == "user":
        return named
    if message.get("role") == "assistant" and named:
        return named
    return None


def _speaker_slug(name: str) -> str:
    return "-".join(_KEY_UNSAFE.sub(" ", name.casefold()).split())[:40].strip("-")


def extract(messages: Iterable[dict[str, Any]]) -> list[Candidate]:
    """Candidates from the messages of ``messages`` (each with ``role``, ``content``, ``id``
    and maybe ``name``) said by a person (see :func:`speaker`); one per key, the latest
    statement winning, with every message it came from. A named speaker's statement
    keeps the name ("Caroline: I love hiking.") and has a key of its own, so two people
    who both "love tea" are two memories."""
    by_key: dict[str, Candidate] = {}
    for message in messages:
        who = speaker(message)
        if who is None:
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text
            content = " ".join(
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        if not isinstance(content, str):
            continue
        slug = _speaker_slug(who)
        for key, type_, text in extract_text(content):
            if slug:
                category, about = key.split(".", 1)
                key, text = f"{category}.{slug}.{about}", f"{who}: {text}"
            earlier = by_key.pop(key, None)
            ids = list(earlier.source_messages) if earlier else []
            if message.get("id") and message["id"] not in ids:
                ids.append(message["id"])
            by_key[key] = Candidate(key=key, type=type_, content=text, source_messages=ids)
    return list(by_key.values())
