"""Long-term memory search as users rely on it, whatever the exact scores: each owner sees
only its own memories (also when another's match better and would fill the limit), the
filters and the limit hold for every strategy, stop words match nothing, the strategy that
answered is the one reported (keyword when there is no query vector, recency when there
are no words), and clear cases come back in the obvious order. Fast: the in-process
``tests.test_memories.fake_embedder``, no server; on SQLite (full text and the
``icontains`` fallback of other databases) and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from persistent_memory import get_store
from persistent_memory.memories import memories_for
from persistent_memory.memories.search import MEMORY, STOP_WORDS, coverage, fuse, query_words, word_weights
from persistent_memory.models import LongTermMemory, MemoryMessage

pytestmark = pytest.mark.django_db

EMBEDDER = {"EMBEDDER": "tests.test_memories.fake_embedder"}
WORDS = ("keyword", "hybrid")


@pytest.fixture(params=["fulltext", "icontains"])
def matching(request, monkeypatch) -> str:
    """Each way words are matched: the database's full text, or ``icontains`` (other databases)."""
    if request.param == "icontains":
        monkeypatch.setattr(connection, "vendor", "other")
    return request.param


def ids(found: list[dict]) -> list[int]:
    return [memory["id"] for memory in found]


def aged(memory: dict, days: float) -> None:
    LongTermMemory.objects.filter(pk=memory["id"]).update(updated_at=timezone.now() - timedelta(days=days))


def test_query_words_leave_out_stop_words_repeats_and_case():
    assert query_words("Do I like THE dog, Dog and dogs?") == ["like", "dog", "dogs"]
    assert query_words("What is it? Who are you?") == []
    assert query_words("Grace's 5 dogs, don't") == ["grace", "5", "dogs", "don"]  # no lone letters
    many = [f"w{n}" for n in range(40)]
    assert query_words(" ".join(many)) == many[:32]


def test_the_stop_words():
    """Golden: a word added or dropped changes what every question matches."""
    assert len(STOP_WORDS) == 52
    assert {"do", "i", "the", "what", "which", "your", "would"} <= STOP_WORDS
    assert not {"not", "no", "dog", "python"} & STOP_WORDS


def test_a_question_of_stop_words_matches_nothing(matching):
    owner = memories_for("user:a")
    owner.add("I do what I like", key="motto")
    assert owner.search("do I", strategy="keyword") == []
    # Hybrid without words to match answers by recency, and says so.
    answer = owner.search_results("do I", strategy="hybrid")
    assert answer.strategy == "recent" and ids(answer.results) == ids(owner.list()[1])


def test_every_strategy_keeps_to_the_owner_and_its_filters(settings, matching):
    settings.PERSISTENT_MEMORY = EMBEDDER
    alice, bob = memories_for("user:alice"), memories_for("user:bob")
    mine = alice.add("Rex is a dog", key="pet")
    episode = alice.add("Walked the dog and the cat", key="walk", type="episodic", session_id="s-1")
    for n in range(5):  # newer and more relevant, of another owner
        bob.add(f"dog dog cat dog {n}", key=f"dog{n}")
    for strategy in ("recent", "keyword", "semantic", "hybrid"):
        found = alice.search("dog", strategy=strategy, limit=1)
        assert len(found) == 1 and found[0]["owner"] == "user:alice", strategy
        assert set(ids(alice.search("dog", strategy=strategy))) == {mine["id"], episode["id"]}, strategy
        assert ids(alice.search("dog", strategy=strategy, types=["episodic"])) == [episode["id"]], strategy
        assert ids(alice.search("dog", strategy=strategy, session_id="s-1")) == [episode["id"]], strategy
        assert alice.search("dog", strategy=strategy, types=[]) == [], strategy
    assert memories_for("user:carol").search("dog", strategy="semantic") == []


def test_the_limit_holds_for_every_strategy(settings, matching):
    settings.PERSISTENT_MEMORY = EMBEDDER
    owner = memories_for("user:a")
    for n in range(5):
        owner.add(f"The dog number {n}", key=f"dog{n}")
    for strategy in ("recent", "keyword", "semantic", "hybrid"):
        assert len(owner.search("dog", strategy=strategy)) == 5, strategy
        assert len(owner.search("dog", strategy=strategy, limit=2)) == 2, strategy


def test_recent_is_newest_update_first():
    owner = memories_for("user:a")
    first, second, third = (owner.add(f"Fact {n}", key=f"f{n}") for n in range(3))
    aged(first, 1)
    aged(second, 2)
    aged(third, 3)
    found = owner.search("", strategy="recent")
    assert ids(found) == [first["id"], second["id"], third["id"]]
    # The newest scores 1, as keyword's best match does; the older ones less.
    assert found[0]["score"] == 1.0 and 1.0 > found[1]["score"] > found[2]["score"] > 0
    # The same moment: the one written last first.
    LongTermMemory.objects.update(updated_at=timezone.now())
    assert ids(owner.search("", strategy="recent")) == [third["id"], second["id"], first["id"]]


def test_more_of_the_question_matched_ranks_first(matching):
    owner = memories_for("user:a")
    one = owner.add("The garden has roses", key="garden")
    both = owner.add("The garden roses are red in June", key="roses")
    owner.add("Unrelated: the car is blue", key="car")
    for strategy in WORDS:
        found = owner.search("red roses in June", strategy=strategy)
        assert ids(found) == [both["id"], one["id"]], strategy
        assert found[0]["score"] > found[1]["score"] > 0, strategy


def test_among_equal_matches_the_fresher_ranks_first(matching):
    owner = memories_for("user:a")
    old = owner.add("Lives near the harbour", key="home.old")
    new = owner.add("Lives near the harbour", key="home.new")
    aged(old, 3)
    aged(new, 1)
    assert ids(owner.search("harbour", strategy="hybrid")) == [new["id"], old["id"]]
    aged(new, 5)
    assert ids(owner.search("harbour", strategy="hybrid")) == [old["id"], new["id"]]


def test_without_an_embedder_hybrid_is_keyword_among_the_matches(matching):
    owner = memories_for("user:a")
    match = owner.add("Rex is a dog", key="pet")
    owner.add("Drinks tea", key="drink")  # newer, no word in common: never brought in
    answer = owner.search_results("dog", strategy="hybrid")
    assert answer.strategy == "keyword" and ids(answer.results) == [match["id"]]
    parts = answer.results[0]["score_parts"]
    assert parts["keyword"] > 0 and parts["semantic"] is None and parts["relevance"] > 0
    assert owner.search_results("dog", strategy="keyword").strategy == "keyword"
    assert owner.search_results("", strategy="keyword") == ([], "keyword")
    assert owner.search_results("dog", strategy="recent").strategy == "recent"


def test_with_an_embedder_and_no_query_vector_the_answer_is_by_keyword(settings, matching):
    """The fake embedder counts topic words: a question without any has a vector with no
    direction, so semantic and hybrid answer by keyword, and say so."""
    settings.PERSISTENT_MEMORY = EMBEDDER
    owner = memories_for("user:a")
    named = owner.add("The cat is called Tom", key="cat")
    coffee = owner.add("I drink espresso", key="coffee")
    for strategy in ("semantic", "hybrid"):
        answer = owner.search_results("Tom", strategy=strategy)
        assert answer.strategy == "keyword" and ids(answer.results) == [named["id"]], strategy
        # With a vector: meaning finds what shares no word with the question.
        answer = owner.search_results("a cup of tea", strategy=strategy)
        assert answer.strategy == strategy and ids(answer.results)[0] == coffee["id"], strategy
    parts = owner.search("a cup of tea", strategy="hybrid")[0]["score_parts"]
    assert parts["keyword"] is None and parts["semantic"] > 0
    # Blank: recency, whatever the embedder.
    assert owner.search_results("  ", strategy="hybrid").strategy == "recent"


def test_hybrid_with_an_embedder_puts_what_both_lists_found_first(settings, matching):
    settings.PERSISTENT_MEMORY = EMBEDDER
    owner = memories_for("user:a")
    both = owner.add("The vim editor for python code", key="editor")
    meaning = owner.add("Writes code every day", key="job")
    owner.add("Walks the dog", key="dog")
    found = owner.search("vim python", strategy="hybrid")
    assert ids(found)[:2] == [both["id"], meaning["id"]]
    assert found[0]["score_parts"]["keyword"] > 0 and found[0]["score_parts"]["semantic"] > 0
    assert found[1]["score_parts"]["keyword"] is None


def test_use_weighs_the_fused_scores(settings, matching):
    """MEMORY_HALF_LIFE_DAYS: an equally relevant memory untouched for a half-life scores
    half; MEMORY_ACCESS_WEIGHT: one used often outranks one as relevant and fresher."""
    owner = memories_for("user:a")
    old = owner.add("Lives near the harbour", key="home.old")
    new = owner.add("Lives near the harbour", key="home.new")
    aged(old, 30)
    aged(new, 1)
    settings.PERSISTENT_MEMORY = {"MEMORY_HALF_LIFE_DAYS": 30}
    found = owner.search("harbour", strategy="hybrid")
    assert ids(found) == [new["id"], old["id"]]
    parts = {m["id"]: m["score_parts"] for m in found}
    assert parts[old["id"]]["recency"] == pytest.approx(0.5, abs=0.01)
    assert parts[new["id"]]["recency"] == pytest.approx(0.5 ** (1 / 30), abs=0.01)
    assert parts[old["id"]]["frequency"] == 1.0  # no access weight by default
    # Found, both were used just now: the decay starts again.
    assert all(m["score_parts"]["recency"] > 0.99 for m in owner.search("harbour", strategy="hybrid"))
    LongTermMemory.objects.filter(pk=old["id"]).update(access_count=50)
    settings.PERSISTENT_MEMORY = {"MEMORY_ACCESS_WEIGHT": 0.5}
    top = owner.search("harbour", strategy="hybrid")[0]
    assert top["id"] == old["id"] and top["score_parts"]["frequency"] > 2
    assert top["score_parts"]["recency"] == 1.0  # no decay without a half-life


def test_alpha_weighs_the_keyword_and_the_semantic_lists(settings, matching):
    """MEMORY_HYBRID_ALPHA 0: the keyword list alone orders hybrid results; 1: meaning alone."""
    owner = memories_for("user:a")
    settings.PERSISTENT_MEMORY = {**EMBEDDER, "MEMORY_HYBRID_ALPHA": 0.0}
    meaning = owner.add("Python is my language", key="language")
    words = owner.add("Takes the stairs at the office", key="stairs")  # no topic: no vector
    assert ids(owner.search("office stairs python", strategy="hybrid")) == [words["id"], meaning["id"]]
    settings.PERSISTENT_MEMORY = {**EMBEDDER, "MEMORY_HYBRID_ALPHA": 1.0}
    assert ids(owner.search("office stairs python", strategy="hybrid"))[0] == meaning["id"]


def test_without_an_embedder_the_better_of_two_matches_ranks_first_though_older(matching):
    """Hybrid without an embedder: recency breaks ties of relevance, it does not overturn
    a match of every word of the question by a fresher match of one."""
    owner = memories_for("user:a")
    weak = owner.add("Bought roses", key="bought")
    best = owner.add("Red roses bloom in June", key="bloom")
    aged(best, 2)
    aged(weak, 1)
    assert ids(owner.search("red roses june", strategy="hybrid")) == [best["id"], weak["id"]]


@pytest.mark.parametrize("half_life", [None, 365])
def test_without_an_embedder_relevance_counts_not_only_recency(settings, matching, half_life):
    """The best match, a day older than a weak one, still ranks first in hybrid; also
    when use weighs in with a half-life of a year (a day's age is worth a fraction of a
    percent there)."""
    settings.PERSISTENT_MEMORY = {"MEMORY_HALF_LIFE_DAYS": half_life}
    owner = memories_for("user:a")
    for n in range(8):  # enough memories that BM25 tells a rare word from a common one
        owner.add(f"Unrelated fact {n}", key=f"fact.{n}")
    weak_old = owner.add("Red wine in June", key="wine")
    other = owner.add("Red roses by the door", key="door")
    best = owner.add("Red roses bloom in June", key="bloom")
    weak_new = owner.add("Bought roses", key="bought")
    for memory, days in ((weak_old, 4), (other, 3), (best, 2), (weak_new, 1)):
        aged(memory, days)
    found = owner.search("red roses june", strategy="hybrid")
    assert ids(found)[0] == best["id"] and set(ids(found)) == {
        weak_old["id"],
        other["id"],
        best["id"],
        weak_new["id"],
    }


def test_without_an_embedder_hybrid_ranks_as_keyword_and_recency_only_breaks_ties(matching):
    """Newer memories that only name the speaker never outrank the older one that answers
    (fused with recency at equal weight, they did: a fifth of keyword's recall)."""
    owner = memories_for("user:a")
    answer = owner.add("Caroline adopted a dog called Rex in May.", key="answer")
    aged(answer, 30)
    chatter = [owner.add(f"Caroline said hello {n} times.", key=f"chatter.{n}") for n in range(10)]
    for n, memory in enumerate(chatter):
        aged(memory, 10 - n)  # the last one the newest
    question = "When did Caroline adopt the dog?"
    by_keyword = ids(owner.search(question, strategy="keyword", limit=11))
    assert by_keyword[0] == answer["id"]
    found = ids(owner.search(question, strategy="hybrid", limit=11))
    assert found[0] == answer["id"]
    assert set(found) == set(by_keyword)
    # The chatter matches equally (one word, the same length): the newest first.
    assert found[1:] == [memory["id"] for memory in reversed(chatter)]


def test_coverage_is_the_share_of_the_questions_words_a_text_holds_stemmed_loosely():
    """What hybrid search weighs its keyword list by: each word of the question (stop words
    left out), found as it is or by its first letters (all but the last three, at least
    four) at the start of a word of the text."""
    assert coverage("What did Caroline adopt?", "Caroline: we adopted a puppy") == 1.0
    assert coverage("What did Caroline adopt?", "Caroline went hiking") == 0.5
    assert coverage("When is the party?", "We partied all night") == 1.0  # party -> part
    assert coverage("Where do cats sleep?", "The cat sleeps") == 0.5  # "cats" (4 letters) whole
    assert coverage("adopting", "adopted") == 1.0 and coverage("adopting", "adapted") == 0.0
    assert coverage("international", "internal") == 0.0  # "internatio" is not held
    assert coverage("the and of", "anything") == 0.0  # no words left
    assert coverage("Caroline", "") == 0.0
    # A possessive's "s" is no word of the question: it would be held by every "that's".
    assert coverage("Grace's home", "That's lovely, Grace") == 0.5


def test_a_word_that_most_texts_hold_weighs_less_than_a_rare_one():
    """A speaker's name, in half of a conversation's turns, tells little; a word no text
    holds tells most (BM25's IDF among the texts both lists found)."""
    weights = word_weights(["tom", "bike", "married"], [{"tom"}, {"tom"}, {"tom", "bike"}, set()])
    assert weights["tom"] < weights["bike"] < weights["married"]
    assert all(weight > 0 for weight in weights.values())


def _keys(*names: str) -> dict[str, tuple[str, int]]:
    return {name: (MEMORY, n) for n, name in enumerate(names, start=1)}


def test_hybrid_fusion_leaves_out_matches_of_incidental_words():
    """A paraphrased question: its keyword matches hold only the speaker's name, and most
    of what it asks is in no text. Meaning alone ranks: weighed in, the name's matches
    outranked the answer (the earlier rule, a match of half the question's words, put the
    first match first)."""
    key = _keys("sealed", "bye", "answer", "other")
    texts = {
        key["sealed"]: "Tom: my lips are sealed",
        key["bye"]: "Tom: see you",
        key["answer"]: "Sam: Hannah and I had our wedding in May",
        key["other"]: "Sam: hello",
    }
    matches = [(key["sealed"], 1.0), (key["bye"], 0.9)]
    near = [(key["answer"], 0.60), (key["sealed"], 0.58), (key["bye"], 0.2), (key["other"], 0.1)]
    fused = fuse(matches, near, query_words("Who is Tom married to?"), texts, 0.5)
    assert [found for found, _ in fused] == [key["answer"], key["sealed"], key["bye"], key["other"]]
    assert dict(fused)[key["sealed"]] == pytest.approx(0.5 * (0.58 - 0.1) / (0.60 - 0.1))


def test_hybrid_fusion_counts_matches_of_what_the_question_asks():
    """A question worded as what was said: the match that holds its rare words outranks
    semantic's first; the name, held by most texts, adds little to the others; and two
    matches that each hold a part of the question together count (a multi-hop question)."""
    key = _keys("answer", "hello", "supervisor", "other")
    texts = {
        key["answer"]: "Aisha: chapter two of my thesis",
        key["hello"]: "Aisha: hello",
        key["supervisor"]: "Aisha: my supervisor wants it by Christmas",
        key["other"]: "Daniel: how is it going?",
    }
    matches = [(key["answer"], 1.0), (key["hello"], 0.2), (key["supervisor"], 0.2)]
    near = [(key["supervisor"], 0.7), (key["answer"], 0.5), (key["hello"], 0.45), (key["other"], 0.1)]
    words = query_words("Which thesis chapter is Aisha on?")
    fused = dict(fuse(matches, near, words, texts, 0.5))
    assert sorted(fused, key=lambda found: -fused[found]) == [
        key["answer"],
        key["supervisor"],
        key["hello"],
        key["other"],
    ]
    assert fused[key["supervisor"]] - 0.5 < 0.1  # the name alone: a fraction of a word
    # Each of two matches holds one of the two rare words: together they hold most of it.
    texts[key["answer"]], texts[key["hello"]] = "Aisha: chapter two", "Aisha: the thesis"
    fused = dict(fuse(matches, near, words, texts, 0.5))
    assert fused[key["answer"]] > fused[key["supervisor"]] and fused[key["hello"]] > 0.5 * 0.35 / 0.6 + 0.2


def test_hybrid_fusion_counts_matches_that_hold_half_of_the_question():
    """The keyword part counts from half of the question's information on (REACH): here
    one word of two, equally rare, held by the match; the other only by a text found by
    meaning."""
    key = _keys("match", "meaning")
    texts = {key["match"]: "The harbour at dawn", key["meaning"]: "A lighthouse on the coast"}
    near = [(key["meaning"], 0.9), (key["match"], 0.1)]
    fused = dict(fuse([(key["match"], 1.0)], near, ["harbour", "lighthouse"], texts, 0.5))
    assert fused == {key["meaning"]: 0.5, key["match"]: 0.25}


def test_recent_is_newest_first_across_memories_and_messages_whatever_their_ids(settings):
    """``recent`` orders a memory by its last update and a message by when it was said,
    in one list; the newer id among equal times first."""
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MIRROR_MODE": "deferred"}
    owner = memories_for("user:r")
    first, second = owner.add("First memory", key="first"), owner.add("Second memory", key="second")
    third = owner.add("Third memory", key="third")
    said = [{"role": "user", "content": f"message {n}"} for n in ("one", "two", "three")]
    get_store().for_owner("user:r").add_messages("s1", said)
    get_store().mirror.sync_dirty()
    one, two, three = MemoryMessage.objects.order_by("id")
    now = timezone.now()
    # Times against the ids' order: in each kind the older row is the newer.
    for model, pk, field, days in (
        (LongTermMemory, first["id"], "updated_at", 1),
        (LongTermMemory, second["id"], "updated_at", 3),
        (LongTermMemory, third["id"], "updated_at", 5),
        (MemoryMessage, one.pk, "created_at", 2),
        (MemoryMessage, two.pk, "created_at", 4),
        (MemoryMessage, three.pk, "created_at", 4),
    ):
        model.objects.filter(pk=pk).update(**{field: now - timedelta(days=days)})
    found = owner.search("", strategy="recent")
    assert [(hit["kind"], hit["content"]) for hit in found] == [
        ("memory", "First memory"),
        ("message", "message one"),
        ("memory", "Second memory"),
        ("message", "message three"),
        ("message", "message two"),
        ("memory", "Third memory"),
    ]
    assert [hit["score"] for hit in found] == [1.0, 0.5, round(1 / 3, 6), 0.25, 0.2, round(1 / 6, 6)]
    # Fewer than there are: the newest of each kind, not the last written.
    assert [hit["content"] for hit in owner.search("", strategy="recent", limit=1)] == ["First memory"]
