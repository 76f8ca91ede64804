"""Benchmark of long-term memory recall over conversations: recall@5 and recall@10 per
kind of question, per strategy, per database.

    python bench/recall_bench.py [--database-url URL] [--setups turns recorded recorded_llm pooled]
                                 [--strategies keyword semantic hybrid ...]
                                 [--conversations 1 2 ...] [--output PATH] [--details PATH]

The development set is bench/recall_corpus.py: eight two-person conversations of four to
six dated sessions, and questions of five kinds (sharing words with their evidence,
paraphrased, temporal, multi-hop, facts that changed), each citing the turns that answer
it. A question's recall@k is the share of its evidence turns found in the first k
results; the figures are the means per kind and over all questions. Each conversation
is one owner (but in ``pooled``): a question searches its own conversation's memories.

Four setups:

* **turns**: every turn stored as one memory (content ``"Name: text"``, key the turn
  id, ``said_at`` the session's time), searched with each strategy: ``keyword``,
  ``semantic``, ``hybrid`` (MEMORY_HYBRID_ALPHA's default, and a sweep of alpha),
  ``hybrid`` with no EMBEDDER (what a site without one runs) and ``recent``.
* **recorded**: the conversations as the app records them: each session appended to the
  store (the embedded ``memory`` backend; the speakers are the ``user`` and the
  ``assistant``, each message with the speaker's ``name`` and the turn id as its id,
  ``created_at`` the session's time; the extraction worker off), then ``memory_extract`` with the default
  extractors, then the same searches; a memory found brings the evidence turns among its
  ``source_messages``. ``coverage`` is the share of the questions' evidence turns that
  any memory came from: what no ranking can find.
* **recorded_llm**: as recorded (owners of its own), but ``memory_extract`` runs the
  chat-completions extractor (``MEMORY_EXTRACTORS``) against bench/llm_standin.py, a
  deterministic extractive stand-in for a model that the bench starts and stops: one
  memory per turn that states something, ``"<Name> said on <date>: <text>"``, citing
  that turn. It measures the plumbing (transcript, request, parse, write, search, the
  cited turns found again), not a model: its figures are an upper bound of what the
  pipeline keeps. ``requests`` is how many requests the stand-in received.
* **pooled**: as turns, but every conversation's turns are one owner's memories (567
  rather than 70 or so): a larger haystack, as a long-lived user's memories are.

A result of ``"kind": "message"`` (a message the search found) stands for the turn
its ``id`` names; a memory (``"kind": "memory"``, or no kind) for its key or its
source messages, as above. Each search is measured alone: the access counts a search
records (which weigh the next hybrid searches) are reset after it. For facts that
changed, ``earlier_first`` is the share of questions whose first result among their
turns (the latest statement or an earlier one) in the first ten is an earlier one. The
embedder is bench/semantic_bench.py's
all-MiniLM-L6-v2 (offline, bench-only dependencies: see there); it is loaded only when a
strategy asked for needs it. Each run uses a database of its own: a temporary SQLite
file by default, or the empty PostgreSQL at --database-url. Results go to
bench/results/local/recall-<database>.json (git ignores it) or --output; with --details,
each question's evidence ranks (per setup and strategy) to a file of their own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(1, str(ROOT))

from llm_standin import standin  # noqa: E402
from memories_bench import setup_django  # noqa: E402
from recall_corpus import CONVERSATIONS, KINDS, QUESTIONS, Question, turn_id  # noqa: E402

#: The embedder of the runs that need one (bench/semantic_bench.py's).
EMBEDDER = "semantic_bench.minilm"
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Every variant: (name, strategy, settings over the site's, needs the embedder).
VARIANTS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("keyword", "keyword", {}, False),
    ("semantic", "semantic", {}, True),
    ("hybrid", "hybrid", {}, True),
    *[(f"hybrid_a{alpha}", "hybrid", {"MEMORY_HYBRID_ALPHA": alpha}, True) for alpha in ALPHAS],
    ("hybrid_no_embedder", "hybrid", {"EMBEDDER": None}, False),
    ("recent", "recent", {}, False),
]
KS = (5, 10)
SETUPS = ("turns", "recorded", "recorded_llm", "pooled")
#: The setups whose memories come from recorded conversations (found by their source messages).
RECORDED = ("recorded", "recorded_llm")
#: recorded_llm's extractor, and its options over the site's (the stand-in's URL is added).
LLM_EXTRACTOR = "persistent_memory.memories.extraction.chat_completions.extract"
LLM_OPTIONS = {"model": "extractive-standin", "api_key_env": None, "timeout": 60}


def session_time(when: str) -> datetime:
    """A session's time (the corpus writes it in UTC)."""
    return datetime.fromisoformat(when).replace(tzinfo=UTC)


def owner_of(conversation: int, setup: str) -> str:
    """Whose memories a question of ``conversation`` searches in ``setup``."""
    return "pooled:all" if setup == "pooled" else f"{setup}:c{conversation}"


def conversation_of(question: Question) -> int:
    return int(question.evidence[0].split(":")[0][1:])


@contextlib.contextmanager
def _settings(overrides: dict[str, Any]) -> Iterator[None]:
    from django.test import override_settings

    from persistent_memory.conf import memory_settings

    with override_settings(PERSISTENT_MEMORY={**memory_settings.user_settings, **overrides}):
        yield


@contextlib.contextmanager
def _clock(at: float) -> Iterator[None]:
    """The conversation store's clock at ``at``: its messages' ``created_at`` is the
    session's time, as when the app records a conversation as it happens."""
    from persistent_memory.chat import messages

    real = messages.time
    messages.time = SimpleNamespace(time=lambda: at)  # type: ignore[assignment]
    try:
        yield
    finally:
        messages.time = real  # type: ignore[assignment]


def store_turns(conversations: list[int], setup: str) -> int:
    """Every turn as one memory of its conversation's owner (of one owner: pooled); how many."""
    from persistent_memory.memories import memories_for

    count = 0
    for number in conversations:
        conversation = CONVERSATIONS[number]
        owner = memories_for(owner_of(number, setup))
        for session, (when, turns) in enumerate(conversation.sessions, start=1):
            for n, speaker, text in turns:
                owner.add(f"{speaker}: {text}", key=turn_id(number, session, n), said_at=session_time(when))
                count += 1
    return count


def record_and_extract(conversations: list[int], setup: str) -> dict[str, Any]:
    """Each session appended to the store under ``setup``'s owners, then ``memory_extract``
    over those owners only (another recorded setup's sessions are not read again); the
    counts, summed over the owners."""
    from io import StringIO

    from django.core.management import call_command

    from persistent_memory import get_store
    from persistent_memory.memories import embedders

    store = get_store()
    for number in conversations:
        conversation = CONVERSATIONS[number]
        first = conversation.speakers[0]
        scoped = store.for_owner(owner_of(number, setup))
        for session, (when, turns) in enumerate(conversation.sessions, start=1):
            messages = [
                {
                    "id": turn_id(number, session, n),
                    "role": "user" if speaker == first else "assistant",
                    "name": speaker,
                    "content": text,
                }
                for n, speaker, text in turns
            ]
            with _clock(session_time(when).timestamp()):
                scoped.add_messages(f"c{number}-s{session}", messages)
    counts: dict[str, Any] = {}
    for number in conversations:
        out = StringIO()
        # Its note about the memory backend once, not once per owner.
        notes = sys.stderr if number == conversations[0] else StringIO()
        call_command("memory_extract", owner=owner_of(number, setup), json=True, stdout=out, stderr=notes)
        for name, value in json.loads(out.getvalue()).items():
            if isinstance(value, int):
                counts[name] = counts.get(name, 0) + value
            elif value is not None or name not in counts:
                counts[name] = value  # last_error: the last one
    # What a search finds of the messages themselves: mirrored (the worker would have,
    # within half a second), and embedded where an embedder is set (the worker's job too).
    store.mirror.sync_dirty()
    if embedders.current() is not None:
        call_command("memory_embed", stdout=StringIO())
    return counts


def _turns_found(setup: str, results: list[dict[str, Any]]) -> list[list[str]]:
    """The turns each result stands for: a message's id (``"kind": "message"``); a
    memory's (``"kind": "memory"``, or no kind) key in turns and pooled, its source
    messages in the recorded setups."""

    def turns(result: dict[str, Any]) -> list[str]:
        if result.get("kind", "memory") == "message":
            return [result["id"]]
        if setup in RECORDED:
            return list(result.get("source_messages") or [])
        return [result["key"]]

    return [turns(result) for result in results]


def _search(owner: Any, question: str, strategy: str) -> list[dict[str, Any]]:
    """The first ten results, then the access counts the search recorded reset (each
    search is measured alone)."""
    from persistent_memory.models import LongTermMemory

    found = owner.search(question, strategy=strategy, limit=max(KS))
    LongTermMemory.objects.filter(owner=owner.owner, access_count__gt=0).update(
        access_count=0, last_accessed_at=None
    )
    return found


def measure(
    setup: str, questions: list[Question], strategy: str, ranks: list[list[int | None]]
) -> dict[str, Any]:
    """recall@k per kind and over all, and how often an earlier statement came first;
    ``ranks`` gets each question's evidence turns' places (1-based; None: not in the ten)."""
    from persistent_memory.memories import memories_for

    sums = {k: {kind: 0.0 for kind in (*KINDS, "all")} for k in KS}
    counts = dict.fromkeys((*KINDS, "all"), 0)
    earlier_first = changed = 0
    for question in questions:
        owner = memories_for(owner_of(conversation_of(question), setup))
        ranked = _turns_found(setup, _search(owner, question.text, strategy))
        evidence = set(question.evidence)
        ranks.append(
            [
                next((n for n, turns in enumerate(ranked, 1) if turn in turns), None)
                for turn in question.evidence
            ]
        )
        for k in KS:
            seen = {turn for turns in ranked[:k] for turn in turns}
            share = len(evidence & seen) / len(evidence)
            sums[k][question.kind] += share
            sums[k]["all"] += share
        counts[question.kind] += 1
        counts["all"] += 1
        if question.earlier:
            changed += 1
            for turns in ranked:
                if evidence & set(turns):
                    break
                if set(question.earlier) & set(turns):
                    earlier_first += 1
                    break
    figures: dict[str, Any] = {
        f"recall_at_{k}": {kind: round(sums[k][kind] / counts[kind], 3) for kind in sums[k] if counts[kind]}
        for k in KS
    }
    if changed:
        figures["earlier_first"] = round(earlier_first / changed, 3)
    return figures


def coverage(questions: list[Question], setup: str) -> dict[str, float]:
    """The share of evidence turns some memory of ``setup`` came from, per kind and over all."""
    from persistent_memory.models import LongTermMemory

    sourced: set[str] = set()
    for sources in LongTermMemory.objects.filter(owner__startswith=f"{setup}:").values_list(
        "source_messages", flat=True
    ):
        sourced.update(sources or [])
    shares: dict[str, list[float]] = {}
    for question in questions:
        share = len(set(question.evidence) & sourced) / len(question.evidence)
        shares.setdefault(question.kind, []).append(share)
        shares.setdefault("all", []).append(share)
    return {kind: round(sum(values) / len(values), 3) for kind, values in shares.items()}


def run(setups: list[str], variants: list[str], conversations: list[int]) -> dict[str, Any]:
    from persistent_memory.conf import memory_settings
    from persistent_memory.memories import vectors
    from persistent_memory.models import LongTermMemory

    chosen = [variant for variant in VARIANTS if variant[0] in variants]
    embedder: dict[str, Any] = {}
    if any(needs for *_, needs in chosen):
        from semantic_bench import minilm

        minilm(["The model loads before any timed request."])
        # Quality, not latency: on a loaded machine a request's vector must not miss the
        # default 0.8 s and leave a memory without one, or a search answering by keyword.
        embedder = {"EMBEDDER": EMBEDDER, "EMBEDDER_REQUEST_TIMEOUT": 300, "EMBEDDER_WORKER": False}
    questions = [question for question in QUESTIONS if conversation_of(question) in conversations]
    results: dict[str, Any] = {
        "conversations": len(conversations),
        "questions": {kind: sum(q.kind == kind for q in questions) for kind in KINDS},
        "embedder": "all-MiniLM-L6-v2" if embedder else None,
        "setups": {},
        "ranks": {},
    }
    # The worker would extract as the messages are written: memory_extract does it once,
    # the same way, and nothing runs beside the searches.
    default_alpha = memory_settings.MEMORY_HYBRID_ALPHA
    with _settings({**embedder, "MEMORY_EXTRACTION_WORKER": False}):
        for setup in setups:
            started = time.perf_counter()
            figures: dict[str, Any] = {}
            if setup in ("turns", "pooled"):
                figures["memories"] = store_turns(conversations, setup)
            elif setup == "recorded":
                figures["extraction"] = record_and_extract(conversations, setup)
            else:
                with (
                    standin() as server,
                    _settings(
                        {
                            "MEMORY_EXTRACTORS": [LLM_EXTRACTOR],
                            "MEMORY_EXTRACTOR_OPTIONS": {**LLM_OPTIONS, "base_url": server.url},
                        }
                    ),
                ):
                    figures["extraction"] = record_and_extract(conversations, setup)
                figures["requests"] = len(server.requests)
            if setup in RECORDED:
                figures["coverage"] = coverage(questions, setup)
                figures["memories"] = LongTermMemory.objects.filter(owner__startswith=f"{setup}:").count()
            figures["write_s"] = round(time.perf_counter() - started, 1)
            _check_embedder()
            if embedder:
                figures["without_vector"] = LongTermMemory.objects.filter(
                    owner__startswith=f"{setup}:", embedding__isnull=True
                ).count()
            figures["strategies"] = {}
            for name, strategy, overrides, _ in chosen:
                if (
                    overrides.get("MEMORY_HYBRID_ALPHA") == default_alpha
                    and "hybrid" in figures["strategies"]
                ):
                    figures["strategies"][name] = figures["strategies"]["hybrid"]  # the same search
                    continue
                ranks = results["ranks"].setdefault(setup, {}).setdefault(name, [])
                with _settings(overrides):
                    figures["strategies"][name] = measure(setup, questions, strategy, ranks)
                _check_embedder()
                progress(f"{setup} {name}: {figures['strategies'][name]['recall_at_5']['all']}")
            results["setups"][setup] = figures
        results["vector_backend"] = vectors.backend()
    return results


def _check_embedder() -> None:
    """A memory stored without its vector, or a search answering by keyword because the
    embedder failed, would make the run measure something else: stop it."""
    from persistent_memory.memories import embedders

    if embedders.health.failures:
        raise SystemExit(
            f"The embedder failed {embedders.health.failures} times: {embedders.health.last_error}"
        )


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def table(results: dict[str, Any]) -> str:
    """The figures as text: one row per setup and strategy, one column per kind."""
    columns = (*KINDS, "all")
    lines = []
    for setup, figures in results["setups"].items():
        for k in KS:
            lines.append(f"\n{setup}: recall@{k}")
            lines.append(
                f"{'strategy':<20}" + "".join(f"{kind:>11}" for kind in columns) + f"{'earlier1st':>11}"
            )
            for name, row in figures["strategies"].items():
                cells = "".join(f"{row[f'recall_at_{k}'].get(kind, float('nan')):>11.3f}" for kind in columns)
                lines.append(f"{name:<20}{cells}{row.get('earlier_first', float('nan')):>11.3f}")
        if "coverage" in figures:
            cells = "".join(f"{figures['coverage'].get(kind, float('nan')):>11.3f}" for kind in columns)
            lines.append(f"{'coverage':<20}{cells}")
            lines.append(f"extraction: {figures['extraction']}")
        if "requests" in figures:
            lines.append(f"requests to the stand-in: {figures['requests']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    # EMBEDDER names semantic_bench's embedder; as scripts, both modules are found on bench/.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="An empty PostgreSQL (default: a temporary SQLite file).")
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument(
        "--strategies", nargs="+", choices=[v[0] for v in VARIANTS], default=[v[0] for v in VARIANTS]
    )
    parser.add_argument("--conversations", nargs="+", type=int, default=sorted(CONVERSATIONS))
    parser.add_argument("--output", type=Path)
    parser.add_argument(
        "--details", type=Path, help="Also write each question's evidence ranks per setup and strategy here."
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        setup_django(args.database_url or f"sqlite:///{folder}/bench.sqlite3")
        from django.db import connection

        figures = run(args.setups, args.strategies, args.conversations)
        ranks = figures.pop("ranks")
        result = {
            "database": connection.vendor,
            "python": platform.python_version(),
            "machine": {"cpus": os.cpu_count(), "load": os.getloadavg()},
            "figures": figures,
        }
    output = args.output or BENCH / "results" / "local" / f"recall-{result['database']}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    if args.details:
        asked = [q._asdict() for q in QUESTIONS if conversation_of(q) in args.conversations]
        args.details.write_text(json.dumps({"questions": asked, "ranks": ranks}) + "\n")
    print(table(figures))


if __name__ == "__main__":
    main()
