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
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from persistent_memory.memories.extraction.candidates import Candidate
from persistent_memory.memories.extraction.chat_completions import ChatCompletionsExtractor
from persistent_memory.memories.search import query_words

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> Any:
    """bench/``name``.py, loaded from its file: bench/ on sys.path would let its modules
    shadow others (timing)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


corpus = _load("recall_corpus")
standin = _load("llm_standin")
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


def _run_bench(tmp_path: Path, *arguments: str) -> dict[str, Any]:
    """The bench's figures for ``arguments`` (a subprocess: the bench sets Django up itself)."""
    output = tmp_path / "recall.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    command = [sys.executable, str(ROOT / "bench" / "recall_bench.py"), *arguments, "--output", str(output)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(output.read_text())["figures"]


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
    setups = ("--setups", "turns", "recorded", "pooled")
    figures = _run_bench(tmp_path, *setups, "--conversations", "1", "2", "--strategies", "keyword")
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
    # What was said is searchable itself: recorded conversations find the turns no memory
    # came from (coverage), as well as turns stored as memories do.
    found = recorded["strategies"]["keyword"]["recall_at_10"]
    assert found["lexical"] > recorded["coverage"]["lexical"]
    assert found["all"] >= turns["strategies"]["keyword"]["recall_at_10"]["all"] - 0.05


def test_the_standin_answers_the_real_extractor_one_memory_per_statement_with_name_date_and_turn():
    said = 1678991400.0  # 2023-03-16 18:30 UTC
    messages = [
        {
            "id": "t1",
            "role": "user",
            "name": "Maya",
            "content": "Hi Jonas! How was your week?",
            "created_at": said,
        },
        {
            "id": "t2",
            "role": "assistant",
            "name": "Jonas",
            "content": "Busy. My sister got engaged in Porto!",
        },
        {"id": "t3", "role": "user", "name": "Maya", "content": "Lovely.", "created_at": said},
        {"id": "t4", "role": "user", "content": "Morning! I ran twelve kilometres on Sunday. You?"},
        {"role": "user", "name": "Maya", "content": "A turn without an id cites nothing to find."},
    ]
    with standin.standin() as server:
        extractor = ChatCompletionsExtractor(
            base_url=server.url, model="standin", api_key_env=None, timeout=30
        )
        found = extractor(messages)
        assert len(server.requests) == 1
        system, transcript = server.requests[0]["messages"]
        assert system["content"] == extractor.prompt
        assert transcript["content"].startswith("[t1] 2023-03-16 18:30 Maya (user): Hi Jonas!")
        # A request of another shape (no system prompt) is refused, not answered.
        request = urllib.request.Request(
            f"{server.url}/chat/completions",
            data=json.dumps({"model": "standin", "messages": [transcript]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)  # noqa: S310 - the loopback stand-in
        assert refused.value.code == 400
    assert found == [
        Candidate(
            "said.jonas.t2", "factual", "Jonas said: Busy. My sister got engaged in Porto!", ["t2"]
        ),  # no created_at: no date
        Candidate(
            "said.user.t4", "factual", "user said: Morning! I ran twelve kilometres on Sunday. You?", ["t4"]
        ),
    ]  # t1: a greeting and a question; t3: one word; the last: no id


def test_the_recorded_llm_setup_extracts_through_the_standin_and_measures_what_it_wrote(tmp_path):
    database = tmp_path / "bench.sqlite3"
    figures = _run_bench(
        tmp_path,
        *("--setups", "recorded_llm", "--conversations", "1", "--database-url", f"sqlite:///{database}"),
        *("--strategies", "keyword", "hybrid_no_embedder"),
    )
    llm = figures["setups"]["recorded_llm"]
    sessions = CONVERSATIONS[1].sessions
    assert llm["requests"] == len(sessions) == llm["extraction"]["sessions"]  # one per session
    assert llm["extraction"]["messages"] == sum(len(lines) for _, lines in sessions)
    assert llm["extraction"]["failed"] == 0 and llm["extraction"]["refused"] == 0
    assert 0 < llm["memories"] == llm["extraction"]["written"] < llm["extraction"]["messages"]
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT owner, key, content, source_messages, said_at FROM persistent_memory_longtermmemory"
        ).fetchall()
    assert len(rows) == llm["memories"]
    turns = {
        turn_id(1, session, n): (speaker, text, when)
        for session, (when, lines) in enumerate(sessions, start=1)
        for n, speaker, text in lines
    }
    for owner, key, content, sources, said_at in rows:
        [turn] = json.loads(sources)
        speaker, text, when = turns[turn]
        assert owner == "recorded_llm:c1" and key.endswith(turn)
        assert content == f"{speaker} said on {when[:10]}: {text}"
        assert said_at.startswith(when.replace("T", " "))  # the session's time
    assert 0 < llm["coverage"]["all"] <= 1 and set(llm["coverage"]) == {*KINDS, "all"}
    assert set(llm["strategies"]) == {"keyword", "hybrid_no_embedder"}
    for strategy in llm["strategies"].values():
        for k in (5, 10):
            assert set(strategy[f"recall_at_{k}"]) == {*KINDS, "all"}
            assert all(0 <= share <= 1 for share in strategy[f"recall_at_{k}"].values())
    # A lexical question shares words with the turn the memory copies: keyword finds it.
    assert llm["strategies"]["keyword"]["recall_at_5"]["lexical"] > 0


def test_a_result_stands_for_a_message_id_a_key_or_source_messages_by_its_kind():
    # In a subprocess: importing the bench puts bench/ on sys.path (see _load).
    code = """if True:
        import json, sys
        sys.path.insert(0, "bench")
        from recall_bench import _turns_found
        results = [
            {"kind": "message", "id": "c1:s1:t2", "key": "x"},
            {"kind": "memory", "key": "c1:s1:t3", "source_messages": ["c1:s1:t4"]},
            {"key": "c1:s1:t5", "source_messages": ["c1:s1:t6", "c1:s1:t7"]},
            {"kind": "memory", "key": "k", "source_messages": None},
        ]
        print(json.dumps({setup: _turns_found(setup, results) for setup in ("turns", "recorded_llm")}))
    """
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {
        "turns": [["c1:s1:t2"], ["c1:s1:t3"], ["c1:s1:t5"], ["k"]],
        "recorded_llm": [["c1:s1:t2"], ["c1:s1:t4"], ["c1:s1:t6", "c1:s1:t7"], []],
    }
