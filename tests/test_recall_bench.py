"""bench/recall_corpus.py is a valid development set (every question's evidence exists,
each kind is large enough, paraphrases share no keyword with their evidence, a changed
fact cites its latest statement and an earlier one), and bench/recall_bench.py runs end
to end on a slice of it with the keyword search (its other strategies need a sentence
model, a bench-only dependency): figures of every kind, within [0, 1], and keyword
search finding what shares its words."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from persistent_memory.memories.search import query_words

ROOT = Path(__file__).resolve().parent.parent
# Loaded from its file: bench/ on sys.path would let its modules shadow others (timing).
_spec = importlib.util.spec_from_file_location("recall_corpus", ROOT / "bench" / "recall_corpus.py")
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)
CONVERSATIONS, KINDS, QUESTIONS, turn_id = (
    corpus.CONVERSATIONS,
    corpus.KINDS,
    corpus.QUESTIONS,
    corpus.turn_id,
)


def _turns() -> dict[str, tuple[str, str, tuple[int, int]]]:
    """Every turn by id: its speaker, its text and its place (session, turn)."""
    turns = {}
    for number, conversation in CONVERSATIONS.items():
        for session, (_, lines) in enumerate(conversation.sessions, start=1):
            for n, speaker, text in lines:
                turns[turn_id(number, session, n)] = (speaker, text, (session, n))
    return turns


def _keywords(text: str, names: set[str]) -> set[str]:
    """The words a keyword search would look for, plurals and -ing/-ed forms as one word;
    the two people's names (in every turn of theirs) and single letters ("Maya's") left out."""
    words = {word for word in query_words(text) if len(word) > 1 and word not in names}
    return {word.removesuffix("s").removesuffix("ing").removesuffix("ed") for word in words}


def test_the_conversations_are_dated_sessions_of_two_people_with_unique_turn_ids():
    assert len(CONVERSATIONS) == 8
    ids = []
    for number, conversation in CONVERSATIONS.items():
        assert 4 <= len(conversation.sessions) <= 6
        times = [datetime.fromisoformat(when) for when, _ in conversation.sessions]
        assert times == sorted(times) and len(set(times)) == len(times)
        for session, (_, lines) in enumerate(conversation.sessions, start=1):
            assert 12 <= len(lines) <= 25
            assert [n for n, _, _ in lines] == list(range(1, len(lines) + 1))
            assert {speaker for _, speaker, _ in lines} == set(conversation.speakers)
            ids += [turn_id(number, session, n) for n, _, _ in lines]
    assert len(ids) == len(set(ids)) == len(_turns())


def test_every_question_cites_turns_that_exist_and_each_kind_has_thirty():
    turns = _turns()
    assert {question.kind for question in QUESTIONS} == set(KINDS)
    for kind in KINDS:
        assert sum(question.kind == kind for question in QUESTIONS) >= 30, kind
    assert len({question.text for question in QUESTIONS}) == len(QUESTIONS)
    for question in QUESTIONS:
        cited = question.evidence + question.earlier
        assert cited and all(turn in turns for turn in cited), question
        assert len({turn.split(":")[0] for turn in cited}) == 1, question  # one conversation
        assert question.answer
        assert len(question.evidence) >= (2 if question.kind == "multi_hop" else 1), question


def test_paraphrases_share_no_keyword_with_their_evidence_and_lexical_ones_do():
    turns = _turns()
    for question in QUESTIONS:
        conversation = CONVERSATIONS[int(question.evidence[0].split(":")[0].removeprefix("c"))]
        names = {name.casefold() for name in conversation.speakers}
        evidence = set().union(*(_keywords(turns[turn][1], names) for turn in question.evidence))
        shared = _keywords(question.text, names) & evidence
        if question.kind == "paraphrase":
            assert shared == set(), question
        if question.kind == "lexical":
            assert shared, question


def test_a_changed_fact_cites_its_latest_statement_after_the_earlier_ones():
    turns = _turns()
    changed = [question for question in QUESTIONS if question.kind == "changed"]
    for question in changed:
        assert len(question.evidence) == 1 and question.earlier, question
        latest = turns[question.evidence[0]][2]
        assert all(turns[turn][2] < latest for turn in question.earlier), question
    assert all(not question.earlier for question in QUESTIONS if question.kind != "changed")


def test_a_keyword_run_on_two_conversations_reports_recall_of_every_kind(tmp_path):
    output = tmp_path / "recall.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    command = [sys.executable, str(ROOT / "bench" / "recall_bench.py"), "--conversations", "1", "2"]
    command += ["--strategies", "keyword", "--output", str(output)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(output.read_text())["figures"]
    asked = [question for question in QUESTIONS if question.evidence[0].split(":")[0] in ("c1", "c2")]
    assert figures["questions"] == {kind: sum(q.kind == kind for q in asked) for kind in KINDS}
    assert figures["embedder"] is None
    turns = figures["setups"]["turns"]
    assert turns["memories"] == sum(len(lines) for n in (1, 2) for _, lines in CONVERSATIONS[n].sessions)
    recorded = figures["setups"]["recorded"]
    assert recorded["extraction"]["messages"] == turns["memories"]
    assert set(recorded["coverage"]) == {*KINDS, "all"}
    assert all(0 <= share <= 1 for share in recorded["coverage"].values())
    for setup in (turns, recorded):
        keyword = setup["strategies"]["keyword"]
        assert set(setup["strategies"]) == {"keyword"}
        assert 0 <= keyword["earlier_first"] <= 1
        for kind in (*KINDS, "all"):
            at_5, at_10 = keyword["recall_at_5"][kind], keyword["recall_at_10"][kind]
            assert 0 <= at_5 <= at_10 <= 1, (kind, at_5, at_10)
    # Lexical questions share words with their turns: keyword search finds some of them.
    assert turns["strategies"]["keyword"]["recall_at_5"]["lexical"] > 0
    # A recorded memory can only bring turns some memory came from.
    for kind in (*KINDS, "all"):
        assert recorded["strategies"]["keyword"]["recall_at_10"][kind] <= recorded["coverage"][kind]
