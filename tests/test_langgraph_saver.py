"""LangGraph's checkpointer on every backend and Redis setup: LangGraph's own conformance
suite (langgraph-checkpoint-conformance), real StateGraphs with interrupts, owners, TTLs,
the sweep, forget-an-owner, export and the memory backend's crash safety."""

from __future__ import annotations

import asyncio
import json
import operator
import random
import signal
import subprocess
import sys
import time
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver, thread_session
from tests.conftest import TOPOLOGIES
from tests.test_crash import database  # noqa: F401 (the fixture: SQLite and PostgreSQL)


@pytest.fixture(params=TOPOLOGIES)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


def conformance_report(make: Any) -> Any:
    """Run LangGraph's conformance suite on savers ``make()`` builds; its report."""

    @checkpointer_test(name="PersistentMemorySaver")
    async def saver() -> Any:
        yield make()

    return asyncio.run(validate(saver))


class TestConformance:
    def test_every_capability_passes(self, store, capsys):
        report = conformance_report(lambda: PersistentMemorySaver.for_owner("conformance"))
        report.print_report()
        printed = capsys.readouterr().out
        with capsys.disabled():
            print(printed)
        assert {name for name, result in report.results.items() if result.detected} == {
            capability.value for capability in ALL_CAPABILITIES
        }
        failures = {name: result.failures for name, result in report.results.items() if not result.passed}
        assert not failures
        assert sum(result.tests_passed for result in report.results.values()) >= 70


# A real graph: a node that asks a human (interrupt) and one that answers ------------


class State(TypedDict):
    messages: Annotated[list[str], operator.add]
    approved: bool
    #: Never written after the first step: its value must be stored once.
    persona: str


def ask(state: State) -> dict[str, Any]:
    decision = interrupt({"question": f"approve {state['messages'][-1]}?"})
    return {"approved": decision == "yes", "messages": [f"human: {decision}"]}


def answer(state: State) -> dict[str, Any]:
    verdict = "approved" if state["approved"] else "refused"
    return {"messages": [f"{state['persona']}: {verdict}"]}


def build(saver: PersistentMemorySaver) -> Any:
    graph = StateGraph(State)
    graph.add_node("ask", ask)
    graph.add_node("answer", answer)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "answer")
    graph.add_edge("answer", END)
    return graph.compile(checkpointer=saver)


def run_turn(graph: Any, thread: str, text: str, decision: str) -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread}}
    paused = graph.invoke({"messages": [f"user: {text}"], "persona": "bot"}, config)
    assert paused["__interrupt__"][0].value == {"question": f"approve user: {text}?"}
    assert graph.get_state(config).next == ("ask",)
    return graph.invoke(Command(resume=decision), config)


async def arun_turn(graph: Any, thread: str, text: str, decision: str) -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread}}
    paused = await graph.ainvoke({"messages": [f"user: {text}"], "persona": "bot"}, config)
    assert paused["__interrupt__"][0].value == {"question": f"approve user: {text}?"}
    return await graph.ainvoke(Command(resume=decision), config)


class TestStateGraph:
    def test_interrupt_and_resume(self, store):
        graph = build(PersistentMemorySaver.for_owner("alice"))
        first = run_turn(graph, "t-1", "hello", "yes")
        assert first["messages"] == ["user: hello", "human: yes", "bot: approved"]
        second = run_turn(graph, "t-1", "again", "no")
        assert second["messages"][-3:] == ["user: again", "human: no", "bot: refused"]
        assert len(second["messages"]) == 6
        # A new saver (another process would do the same) reads the thread back.
        again = build(PersistentMemorySaver.for_owner("alice"))
        state = again.get_state({"configurable": {"thread_id": "t-1"}})
        assert state.values["messages"] == second["messages"] and state.next == ()
        history = list(again.get_state_history({"configurable": {"thread_id": "t-1"}}))
        assert len(history) >= 8 and history[0].values == state.values

    def test_ainvoke_on_threads_at_once(self, store):
        graph = build(PersistentMemorySaver.for_owner("alice"))

        async def main() -> list[dict[str, Any]]:
            return await asyncio.gather(*(arun_turn(graph, f"a-{i}", f"q{i}", "yes") for i in range(6)))

        results = asyncio.run(main())
        for i, result in enumerate(results):
            assert result["messages"] == [f"user: q{i}", "human: yes", "bot: approved"]

    def test_invoke_from_threads_at_once(self, store):
        from concurrent.futures import ThreadPoolExecutor

        graph = build(PersistentMemorySaver.for_owner("alice"))
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda i: run_turn(graph, f"p-{i}", f"q{i}", "no"), range(8)))
        assert [r["messages"][-1] for r in results] == ["bot: refused"] * 8

    def test_channel_values_are_stored_once_per_version(self, store):
        saver = PersistentMemorySaver.for_owner("alice")
        graph = build(saver)
        for turn in range(5):
            run_turn(graph, "t-1", f"turn {turn}", "yes")
        entries = store.for_owner("alice").checkpoint_entries(thread_session("t-1"))
        blobs = [name for name in entries if name[0] == "b"]
        persona = [name for name in blobs if name.split("\x1f")[1] == "persona"]
        # Written by every input, but the same value: stored each time its version moved.
        checkpoints = [name for name in entries if name[0] == "c"]
        assert len(persona) <= 5 < len(checkpoints)
        # Every checkpoint references a value per channel it has, each stored once.
        links = [entries["l" + name[1:]].split("\x1e")[1:] for name in checkpoints]
        assert len({ref for refs in links for ref in refs}) == len(blobs)


class TestOwners:
    def test_a_thread_is_its_owners_alone(self, store):
        alice, bob = PersistentMemorySaver.for_owner("alice"), PersistentMemorySaver.for_owner("bob")
        run_turn(build(alice), "shared-name", "secret", "yes")
        config = {"configurable": {"thread_id": "shared-name", "checkpoint_ns": ""}}
        assert bob.get_tuple(config) is None
        assert list(bob.list(config)) == [] and list(bob.list(None)) == []
        runs = {t.metadata.get("run_id") for t in alice.list(config)}
        bob.delete_for_runs(list(runs))
        bob.prune(["shared-name"], strategy="delete")
        bob.copy_thread("shared-name", "stolen")
        assert list(bob.list({"configurable": {"thread_id": "stolen"}})) == []
        mine = list(alice.list(config))
        assert mine and mine[0].checkpoint["channel_values"]["messages"][-1] == "bot: approved"
        assert {t.config["configurable"]["thread_id"] for t in alice.list(None)} == {"shared-name"}
        # The same thread id of another owner is another thread.
        run_turn(build(bob), "shared-name", "bob's", "no")
        assert alice.get_tuple(config).checkpoint["channel_values"]["messages"][0] == "user: secret"

    def test_thread_ids_that_are_not_session_ids(self, store):
        saver = PersistentMemorySaver.for_owner("alice")
        for thread in ("user:42/chat 1", "é" * 200, "x" * 124, "x" * 125):
            run_turn(build(saver), thread, "hi", "yes")
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {
            "user:42/chat 1",
            "é" * 200,
            "x" * 124,
            "x" * 125,
        }

    def test_bad_input_writes_nothing(self, store):
        from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

        from persistent_memory.exceptions import InvalidValue

        saver = PersistentMemorySaver.for_owner("alice")
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": "bad\x1fns"}}
        with pytest.raises(InvalidValue):
            saver.put(config, generate_checkpoint(), {"source": "input", "step": 0}, {})
        assert list(saver.list(None)) == []
        assert store.for_owner("alice").list_sessions() == []


class TestLifetime:
    def test_a_thread_expires_with_its_ttl(self, store):
        from tests.timing import LIVE_TTL, wait_past

        saver = PersistentMemorySaver.for_owner("alice", ttl=LIVE_TTL)
        run_turn(build(saver), "short", "hi", "yes")
        info = store.for_owner("alice").session_info(thread_session("short"))
        assert info["ttl_seconds"] == LIVE_TTL
        assert saver.get_tuple({"configurable": {"thread_id": "short"}}) is not None
        wait_past(info["expires_at"])
        assert saver.get_tuple({"configurable": {"thread_id": "short"}}) is None
        assert list(saver.list(None)) == []

    @pytest.mark.django_db
    def test_forgetting_the_owner_forgets_its_threads(self, store):
        from persistent_memory.operations.forget import forget_owner

        alice, bob = PersistentMemorySaver.for_owner("alice"), PersistentMemorySaver.for_owner("bob")
        run_turn(build(alice), "t", "hi", "yes")
        run_turn(build(bob), "t", "hi", "yes")
        forget_owner("alice")
        assert list(alice.list(None)) == [] and store.for_owner("alice").list_sessions() == []
        assert len(list(bob.list(None))) > 1

    def test_delete_thread_deletes_its_session(self, store):
        saver = PersistentMemorySaver.for_owner("alice")
        run_turn(build(saver), "gone", "hi", "yes")
        saver.delete_thread("gone")
        assert store.for_owner("alice").list_sessions() == []

    def test_export_and_import_carry_checkpoints(self, store):
        from persistent_memory.operations.maintenance import export_sessions, import_sessions

        saver = PersistentMemorySaver.for_owner("alice")
        run_turn(build(saver), "kept", "hi", "yes")
        config = {"configurable": {"thread_id": "kept"}}
        before = [t.checkpoint for t in saver.list(config)]
        lines = [json.dumps(record) for record in export_sessions(owner="alice", store=store)]
        assert "checkpoints" in json.loads(lines[0])
        saver.delete_thread("kept")
        import_sessions(lines, store=store)
        assert [t.checkpoint for t in saver.list(config)] == before
        assert run_turn(build(saver), "kept", "more", "no")["messages"][-1] == "bot: refused"


@pytest.mark.parametrize("backend_name", ["redis", "redis-cluster-layout"])
class TestRedisKeys:
    def keys(self, client: Any) -> list[str]:
        return sorted(key.decode() for key in client.scan_iter("*~cp*"))

    def test_every_key_expires_with_the_session(self, store, redis_client):
        saver = PersistentMemorySaver.for_owner("alice", ttl=3600)
        run_turn(build(saver), "t", "hi", "yes")
        keys = self.keys(redis_client)
        assert len(keys) == 2
        meta = next(k for k in redis_client.scan_iter("*__meta__"))
        deadline = redis_client.pexpiretime(meta)
        assert [redis_client.pexpiretime(key) for key in keys] == [deadline, deadline]

    @pytest.mark.django_db
    def test_forget_and_sweep_leave_no_checkpoint_key(self, store, redis_client):
        from persistent_memory.operations.forget import forget_owner
        from persistent_memory.operations.maintenance import sweep

        run_turn(build(PersistentMemorySaver.for_owner("alice")), "t", "hi", "yes")
        run_turn(build(PersistentMemorySaver.for_owner("bob")), "t", "hi", "yes")
        forget_owner("alice")
        assert [key for key in self.keys(redis_client) if "alice" in key] == []
        assert len(self.keys(redis_client)) == 2
        # A thread whose meta is gone (a crash between commands of another client): swept.
        meta = next(k for k in redis_client.scan_iter("*bob*__meta__"))
        redis_client.delete(meta)
        sweep(store=store)
        assert self.keys(redis_client) == []

    def test_one_script_call_per_method(self, store, monkeypatch):
        saver = PersistentMemorySaver.for_owner("alice")
        run_turn(build(saver), "t", "hi", "yes")
        backend = store.backend
        calls: list[str] = []
        original = backend._call
        monkeypatch.setattr(backend, "_call", lambda op, *a, **k: calls.append(op) or original(op, *a, **k))
        config = saver.get_tuple({"configurable": {"thread_id": "t"}}).config
        saver.put_writes(config, [("messages", ["x"])], "task-1")
        saver.put(config, saver.get_tuple(config).checkpoint | {"id": "z" * 8}, {"step": 9}, {"messages": 9})
        assert calls == ["cp_get", "cp_writes", "cp_get", "cp_put"]


# The memory backend's checkpoints survive a restart, and SIGKILL ---------------------

WRITER = """
import sys, time
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from persistent_memory.integrations.langgraph import PersistentMemorySaver
saver = PersistentMemorySaver.for_owner("alice")
parent = None
for step in range(100000):
    config = {"configurable": {"thread_id": "crash", "checkpoint_ns": ""}}
    if parent:
        config["configurable"]["checkpoint_id"] = parent
    checkpoint = generate_checkpoint(channel_values={"n": step}, channel_versions={"n": step + 1})
    saved = saver.put(config, checkpoint, {"source": "loop", "step": step}, {"n": step + 1})
    saver.put_writes(saved, [("n", step)], f"task-{step}")
    parent = saved["configurable"]["checkpoint_id"]
    print(parent, step, flush=True)
    time.sleep(0.002)
"""

READER = """
from persistent_memory.integrations.langgraph import PersistentMemorySaver
saver = PersistentMemorySaver.for_owner("alice")
for item in saver.list({"configurable": {"thread_id": "crash", "checkpoint_ns": ""}}):
    n = item.checkpoint["channel_values"]["n"]
    assert item.pending_writes == [(f"task-{n}", "n", n)], item.pending_writes
    print(item.checkpoint["id"], n)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")
def test_sigkill_loses_no_checkpoint(database):  # noqa: F811 (the fixture imported above)
    """Checkpoints a process acknowledged are there after it is killed (some of them only in
    the mirror by then, the journal's segment that had them dropped; some only in the
    journal), on SQLite and on PostgreSQL (tests.test_crash's ``database``)."""
    from tests.servers import ROOT, demo_env, manage, prepare_database

    env = demo_env(DATABASE_URL=database.url, MEMORY_BACKEND="memory")
    prepare_database(env)
    acknowledged: dict[str, int] = {}
    for _ in range(2):
        writer = subprocess.Popen(
            [sys.executable, "manage.py", "shell", "--no-imports", "-c", WRITER],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        started, lines = time.monotonic(), 0
        # Long enough for the mirror to have caught up (twice a second) and let the
        # journal go, then at a random moment.
        stop_after = 1.5 + random.random()
        while time.monotonic() - started < stop_after or lines < 20:
            line = writer.stdout.readline()
            assert line, "the writer stopped"
            checkpoint_id, step = line.split()
            acknowledged[checkpoint_id] = int(step)
            lines += 1
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
        found = dict(line.split() for line in manage(env, "shell", "--no-imports", "-c", READER).splitlines())
        assert {cid: int(step) for cid, step in found.items() if cid in acknowledged} == acknowledged


@pytest.mark.django_db(transaction=True)
def test_the_mirror_gives_a_restart_its_checkpoints(settings, tmp_path):
    """In one process: the mirror writes only what changed, and a fresh memory store loads it."""
    from persistent_memory.models import CheckpointEntry
    from persistent_memory.store import get_store, reset_store
    from tests.conftest import memory_settings_for

    settings.PERSISTENT_MEMORY = memory_settings_for("memory", MIRROR_MODE="deferred")
    store = get_store()
    saver = PersistentMemorySaver.for_owner("alice")
    graph = build(saver)
    run_turn(graph, "t", "one", "yes")
    store.mirror.sync_dirty()
    first = {e.name: e.pk for e in CheckpointEntry.objects.all()}
    run_turn(graph, "t", "two", "no")
    store.mirror.sync_dirty()
    second = {e.name: e.pk for e in CheckpointEntry.objects.all()}
    # Entries already mirrored were not written again.
    assert all(second[name] == pk for name, pk in first.items()) and len(second) > len(first)
    saver.prune(["t"])  # a removal: the next sync writes the thread whole
    store.mirror.sync_dirty()
    assert set(CheckpointEntry.objects.values_list("name", flat=True)) == set(
        store.for_owner("alice").checkpoint_entries(thread_session("t"))
    )
    state = graph.get_state({"configurable": {"thread_id": "t"}}).values
    reset_store()
    restarted = get_store()
    assert restarted is not store
    assert restarted.mirror.restore() == 1
    again = build(PersistentMemorySaver.for_owner("alice"))
    assert again.get_state({"configurable": {"thread_id": "t"}}).values == state
    assert run_turn(again, "t", "three", "yes")["messages"][-1] == "bot: approved"


@pytest.mark.django_db(transaction=True)
def test_the_mirror_keeps_an_imported_thread_as_it_grows(settings):
    """An import starts the thread's checkpoints afresh (no mirror counters): the next syncs
    write it whole, then what changed, and a restart from the mirror has every checkpoint."""
    from persistent_memory.models import CheckpointEntry
    from persistent_memory.operations.maintenance import export_sessions, import_sessions
    from persistent_memory.store import get_store, reset_store
    from tests.conftest import memory_settings_for

    settings.PERSISTENT_MEMORY = memory_settings_for("memory", MIRROR_MODE="deferred")
    store = get_store()
    saver = PersistentMemorySaver.for_owner("alice")
    graph = build(saver)
    run_turn(graph, "t", "one", "yes")
    lines = [json.dumps(record) for record in export_sessions(owner="alice", store=store)]
    saver.delete_thread("t")
    import_sessions(lines, store=store)
    store.mirror.sync_dirty()
    run_turn(graph, "t", "two", "no")
    store.mirror.sync_dirty()
    entries = store.for_owner("alice").checkpoint_entries(thread_session("t"))
    assert dict(CheckpointEntry.objects.values_list("name", "value")) == entries
    config = {"configurable": {"thread_id": "t"}}
    history = [state.values for state in graph.get_state_history(config)]
    reset_store()
    assert get_store().mirror.restore() == 1
    again = build(PersistentMemorySaver.for_owner("alice"))
    assert [state.values for state in again.get_state_history(config)] == history


@pytest.mark.django_db(transaction=True)
def test_the_mirror_follows_a_copy_onto_a_mirrored_thread(settings):
    """A copy replaces the target's checkpoints whole: the next sync rewrites the target, so
    none of its old entries stays in the mirror."""
    from persistent_memory.models import CheckpointEntry
    from persistent_memory.store import get_store
    from tests.conftest import memory_settings_for

    settings.PERSISTENT_MEMORY = memory_settings_for("memory", MIRROR_MODE="deferred")
    store = get_store()
    saver = PersistentMemorySaver.for_owner("alice")
    graph = build(saver)
    run_turn(graph, "source", "one", "yes")
    run_turn(graph, "target", "two", "no")
    run_turn(graph, "target", "three", "yes")
    store.mirror.sync_dirty()
    saver.copy_thread("source", "target")
    store.mirror.sync_dirty()
    owned = store.for_owner("alice")
    held = [*owned.checkpoint_entries(thread_session("source")).items()]
    held += owned.checkpoint_entries(thread_session("target")).items()
    assert sorted(CheckpointEntry.objects.values_list("name", "value")) == sorted(held)


@pytest.mark.parametrize("backend_name", ["memory", "redis"])
@pytest.mark.django_db
def test_the_admin_shows_a_threads_checkpoints(configure):
    from django.contrib.auth import get_user_model
    from django.test import Client

    from persistent_memory.models import MemorySession

    store = configure(MIRROR_MODE="deferred")
    run_turn(build(PersistentMemorySaver.for_owner("alice")), "t-1", "hello", "yes")
    store.for_owner("alice").create_session("plain")
    store.mirror.sync_dirty()
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = Client()
    client.force_login(user)

    def page(session_id: str) -> str:
        pk = MemorySession.objects.get(owner="alice", session_id=session_id).pk
        response = client.get(f"/admin/persistent_memory/memorysession/{pk}/change/")
        assert response.status_code == 200
        return response.content.decode()

    body = page(thread_session("t-1"))
    newest = PersistentMemorySaver.for_owner("alice").get_tuple({"configurable": {"thread_id": "t-1"}})
    assert f"<code>{newest.config['configurable']['checkpoint_id']}</code>" in body
    assert "<td>messages, persona</td>" in body or "<td>approved, messages, persona</td>" in body
    assert body.count("<tr><td><code>") == len(list(PersistentMemorySaver.for_owner("alice").list(None)))
    assert 'name="_save"' not in body
    assert "Graph checkpoints" in body and "Graph checkpoints" not in page("plain")
    # Its `messages` channel holds strings, no chat messages: no transcript, and it says why.
    assert "holds no chat messages" in body and "pm-transcript" not in body


# Lists stored as deltas: linear storage, cold reads, forks, prunes ---------------------


class Chat(TypedDict):
    messages: Annotated[list[dict[str, str]], operator.add]


def in_place(left: list[Any], right: list[Any]) -> list[Any]:
    left.extend(right)  # a reducer that changes the list it was given
    return left


class Mutating(TypedDict):
    messages: Annotated[list[str], in_place]


def chat_graph(saver: PersistentMemorySaver, state: type = Chat) -> Any:
    def reply(chat: Any) -> dict[str, Any]:
        return {"messages": [{"role": "assistant", "content": f"reply {len(chat['messages'])}"}]}

    graph = StateGraph(state)
    graph.add_node("reply", reply)
    graph.add_edge(START, "reply")
    graph.add_edge("reply", END)
    return graph.compile(checkpointer=saver)


def chat_turns(graph: Any, thread: str, turns: range) -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread}}
    for turn in turns:
        result = graph.invoke(
            {"messages": [{"role": "user", "content": f"turn {turn} " + "x" * 200}]}, config
        )
    return result


def value_bytes(store: Any, thread: str) -> int:
    entries = store.for_owner("alice").checkpoint_entries(thread_session(thread))
    return sum(len(text) for name, text in entries.items() if name[0] == "b")


def cold_state(thread: str) -> dict[str, Any]:
    """The thread's state as a process that never saw it reads it."""
    from persistent_memory.integrations.langgraph_values import LATEST

    LATEST.forget(())
    return build_cold().get_state({"configurable": {"thread_id": thread}}).values


def build_cold() -> Any:
    return chat_graph(PersistentMemorySaver.for_owner("alice"))


class TestDeltas:
    def test_storage_grows_linearly(self, store):
        graph = chat_graph(PersistentMemorySaver.for_owner("alice"))
        chat_turns(graph, "short", range(10))
        chat_turns(graph, "long", range(40))
        # Whole lists would be (40/10)^2 = 16 times the bytes; deltas about 4 (plus one
        # whole list every 64 deltas).
        assert value_bytes(store, "long") / value_bytes(store, "short") < 6

    def test_a_cold_read_rebuilds_the_list(self, store):
        graph = chat_graph(PersistentMemorySaver.for_owner("alice"))
        warm = chat_turns(graph, "t", range(70))  # 140 writes: past a whole list's 64 deltas
        assert len(warm["messages"]) == 140
        config = {"configurable": {"thread_id": "t"}}
        seen = [state.values for state in graph.get_state_history(config)]
        assert cold_state("t") == warm
        # Every checkpoint of the thread, each read back from a chain of its own.
        assert [state.values for state in build_cold().get_state_history(config)] == seen
        assert {len(values.get("messages", [])) for values in seen} == set(range(141))

    def test_a_thread_deleted_elsewhere_is_written_whole(self, store):
        graph = chat_graph(PersistentMemorySaver.for_owner("alice"))
        chat_turns(graph, "t", range(3))
        # Deleted behind this process's back: its newest list is not the thread's any more.
        store.for_owner("alice").delete_session(thread_session("t"))
        other = chat_graph(PersistentMemorySaver.for_owner("alice"))
        chat_turns(other, "t", range(3))
        assert cold_state("t")["messages"][-1] == {"role": "assistant", "content": "reply 5"}
        assert len(cold_state("t")["messages"]) == 6

    def test_a_pruned_thread_keeps_what_its_newest_list_extends(self, store):
        saver = PersistentMemorySaver.for_owner("alice")
        warm = chat_turns(chat_graph(saver), "t", range(5))
        saver.prune(["t"])
        assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 1
        assert cold_state("t") == warm

    def test_deleting_runs_keeps_what_the_kept_lists_extend(self, store):
        import uuid

        saver = PersistentMemorySaver.for_owner("alice")
        graph = chat_graph(saver)
        runs = [str(uuid.uuid4()) for _ in range(6)]
        for turn, run in enumerate(runs):
            message = {"role": "user", "content": f"turn {turn}"}
            warm = graph.invoke({"messages": [message]}, {"configurable": {"thread_id": "t", "run_id": run}})
        config = {"configurable": {"thread_id": "t"}}
        history = list(graph.get_state_history(config))
        assert {state.metadata.get("run_id") for state in history} == set(runs)
        kept = [state.values for state in history if state.metadata["run_id"] not in runs[:3]]
        saver.delete_for_runs(runs[:3])
        assert cold_state("t") == warm
        cold = list(build_cold().get_state_history(config))
        assert [state.values for state in cold] == kept
        assert {state.metadata.get("run_id") for state in cold} == set(runs[3:])

    def test_a_reducer_that_changes_its_list_in_place(self, store):
        graph = chat_graph(PersistentMemorySaver.for_owner("alice"), Mutating)
        config = {"configurable": {"thread_id": "m"}}
        for turn in range(4):
            warm = graph.invoke({"messages": [f"turn {turn}"]}, config)
        from persistent_memory.integrations.langgraph_values import LATEST

        LATEST.forget(())
        cold = chat_graph(PersistentMemorySaver.for_owner("alice"), Mutating).get_state(config).values
        assert cold == warm and len(cold["messages"]) == 8


def test_listing_a_thread_before_a_checkpoint_spans_its_namespaces_and_any_ids(store):
    """Checkpoint ids are the caller's (LangGraph's are uuid6, others need not be): a
    namespace lists whole, and a thread-wide ``before`` cuts every namespace at that id."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    saver = PersistentMemorySaver.for_owner("alice")
    for ns, ids in {"": ["a1", "b2", "c3"], "inner": ["a0", "x9"]}.items():
        for checkpoint_id in ids:
            config = {"configurable": {"thread_id": "t", "checkpoint_ns": ns}}
            saver.put(config, generate_checkpoint(checkpoint_id=checkpoint_id), generate_metadata(), {})

    def listed(configurable: dict[str, str], before: str | None = None) -> list[tuple[str, str]]:
        cut = {"configurable": {"checkpoint_id": before}} if before else None
        found = saver.list({"configurable": {"thread_id": "t", **configurable}}, before=cut)
        return [(c.config["configurable"]["checkpoint_ns"], c.checkpoint["id"]) for c in found]

    assert listed({"checkpoint_ns": ""}) == [("", "c3"), ("", "b2"), ("", "a1")]
    assert listed({"checkpoint_ns": ""}, before="b2") == [("", "a1")]
    assert sorted(listed({}, before="b2")) == [("", "a1"), ("inner", "a0")]
    assert sorted(listed({})) == sorted(listed({"checkpoint_ns": ""}) + listed({"checkpoint_ns": "inner"}))


def test_a_namespace_reads_only_its_own_checkpoints_beside_one_it_begins(store):
    """A namespace's checkpoints are its own, not those of a longer one starting with it
    ("a" and "a b": the space sorts right after the key separator)."""
    for ns, ids in {"a": ["1", "2"], "a b": ["3"], "ab": ["4"]}.items():
        for checkpoint_id in ids:
            store.put_checkpoint("t", ns, checkpoint_id, f"{ns}/{checkpoint_id}")
    assert store.get_checkpoint("t", "a").record == "a/2"
    assert store.get_checkpoint("t", "b") is None  # a namespace with none
    assert [cp.record for cp in store.list_checkpoints("t", "a")] == ["a/2", "a/1"]
    assert [cp.record for cp in store.list_checkpoints("t", "a b")] == ["a b/3"]
    assert store.prune_checkpoints("t") == 1
    assert sorted(cp.record for cp in store.list_checkpoints("t")) == ["a b/3", "a/2", "ab/4"]


def test_pruning_and_deleting_runs_count_only_what_they_removed(store):
    assert store.prune_checkpoints("t") == 0  # no session
    store.create_session("t")  # a session without checkpoints
    assert store.prune_checkpoints("t") == 0
    assert store.delete_checkpoint_runs("t", ["run-a"]) == 0
    store.put_checkpoint("t", "", "c1", "one", run_id="run-a")
    store.put_checkpoint("t", "inner", "c1", "inner one")
    assert store.prune_checkpoints("t") == 0  # each is the newest of its namespace
    assert store.delete_checkpoint_runs("t", ["run-b"]) == 0
    assert store.delete_checkpoint_runs("t", ["run-a"]) == 1
    assert [cp.record for cp in store.list_checkpoints("t")] == ["inner one"]


def test_a_prune_keeps_every_value_the_kept_checkpoint_references(store):
    first, second = "a\x1f1", "b\x1f1"
    store.put_checkpoint("t", "", "c1", "one", refs=[first], blobs={first: "A"})
    store.put_checkpoint("t", "", "c2", "two", refs=[first, second], blobs={second: "B"})
    assert store.prune_checkpoints("t") == 1
    assert store.get_checkpoint("t", "").blobs == {first: "A", second: "B"}
    assert store.get_checkpoint("t", "", "c1") is None


def test_a_chain_of_values_that_loops_back_ends_where_it_started(store):
    """Copied entries are held as given: a delta whose bases loop back to it reads each
    value once, and a prune that walks the chain ends too."""
    d = "\x1d"
    entries = {
        "b\x1fch\x1f1": f"d{d}v1{d}ch\x1f2{d}v2{d}one",
        "b\x1fch\x1f2": f"d{d}v2{d}ch\x1f1{d}v1{d}two",
    }
    store.load_checkpoint_entries("t", entries)
    assert store.checkpoint_chain("t", "", "ch\x1f1") == [entries["b\x1fch\x1f1"], entries["b\x1fch\x1f2"]]
    store.put_checkpoint("t", "", "c1", "one", refs=["ch\x1f1"])
    store.put_checkpoint("t", "", "c2", "two", refs=["ch\x1f2"])
    assert store.prune_checkpoints("t") == 1
    assert set(store.checkpoint_entries("t")) >= set(entries)


def test_a_page_of_checkpoints_holds_limit_of_them_from_offset(store):
    for checkpoint_id in ("c1", "c2", "c3", "c4"):
        store.put_checkpoint("t", "", checkpoint_id, checkpoint_id)
    for ns in ("", None):
        assert [cp.record for cp in store.list_checkpoints("t", ns, limit=2)] == ["c4", "c3"]
        assert [cp.record for cp in store.list_checkpoints("t", ns, offset=1, limit=2)] == ["c3", "c2"]
        assert [cp.record for cp in store.list_checkpoints("t", ns, offset=3, limit=2)] == ["c1"]


def test_checkpoint_writes_create_their_session_with_the_default_ttl(configure):
    store = configure(SESSION_TTL_HOURS=1)
    store.put_checkpoint_writes("t", "", "c1", [("task", 0, "channel", "value", "")])
    store.put_checkpoint("t2", "", "c1", "one")
    for session_id in ("t", "t2"):
        assert store.session_info(session_id)["ttl_seconds"] == 3600


def test_a_delta_value_must_extend_one_held_or_given_with_it(store):
    from persistent_memory.exceptions import CheckpointBaseMissing

    d, full, delta = "\x1d", "ch\x1f1", "ch\x1f2"
    base = f"f{d}v1{d}whole"
    extension = f"d{d}v2{d}{full}{d}v1{d}more"
    with pytest.raises(CheckpointBaseMissing, match="extends a value this thread does not hold"):
        store.put_checkpoint("t", "", "c1", "one", refs=[delta], blobs={delta: extension})
    assert store.checkpoint_entries("t") == {}
    # Given with the value it extends, in the same put: held.
    store.put_checkpoint("t", "", "c1", "one", refs=[full, delta], blobs={full: base, delta: extension})
    assert store.checkpoint_chain("t", "", delta) == [extension, base]
    # Or extending one held since.
    later = f"d{d}v3{d}{delta}{d}v2{d}most"
    store.put_checkpoint("t", "", "c2", "two", refs=["ch\x1f3"], blobs={"ch\x1f3": later})
    assert store.checkpoint_chain("t", "", "ch\x1f3") == [later, extension, base]
