"""Safe retries: every write of the REST API takes an ``Idempotency-Key``.

A repeat of a key by the same owner gets the first answer (status and body) and is not
applied again, also after a 503 whose write was in fact applied (made real below with a
Redis kept busy past the client's socket timeout). The state is checked through the
store, never only through the API under test. Both backends, through conftest's
``configure``; the Redis-only tests look at the keys the script wrote.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory import get_store
from persistent_memory.backends.redis.functions import library_calls
from persistent_memory.exceptions import IdempotencyKeyReused, InvalidIdempotencyKey, InvalidValue
from persistent_memory.idempotency import Idempotency, fingerprint, validate_idempotency_key
from persistent_memory.store import MemoryStore
from tests.conftest import memory_settings_for
from tests.timing import LIVE_TTL, wait_past, wait_until

API = "/api/memory/"
KEY = "3f9c1e0a-7b2d-4c55-9e1f-retry"


class Caller:
    """A user with a token, the API client that sends as them, and their owner's store."""

    def __init__(self, pk: int) -> None:
        user = get_user_model().objects.create_user(f"caller-{pk}", pk=pk)
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
        self.owner = f"user:{pk}"

    @property
    def store(self) -> MemoryStore:
        return get_store().for_owner(self.owner)

    def send(self, method: str, path: str, body: Any = None, key: str | None = None) -> Any:
        headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
        return getattr(self.client, method)(API + path, body, format="json", **headers)


@pytest.fixture
def alice(db: Any, configure: Any) -> Caller:
    configure()
    return Caller(4242)


@pytest.fixture
def bob(db: Any, alice: Caller) -> Caller:
    return Caller(4343)


def error_of(response: Any) -> tuple[int, str]:
    assert response["Content-Type"] == "application/json"
    return response.status_code, response.json()["code"]


def question(session_id: str, text: str = "q") -> dict[str, Any]:
    return {"text": text, "metadata": {"session_id": session_id}}


def answer(session_id: str | None, text: str = "a") -> dict[str, Any]:
    return {"text": text, "metadata": {} if session_id is None else {"session_id": session_id}}


def nothing(store: MemoryStore) -> None:
    pass


def history_ops(store: MemoryStore, session_id: str = "s1") -> list[str]:
    return [entry["op"] for entry in store.get_history(session_id, 0)]


def _created_with_a(store: MemoryStore) -> None:
    store.create_session("s1")
    store.put("s1", "a", 1)


def _recreated_with_b(store: MemoryStore) -> None:
    store.create_session("s1")
    store.put("s1", "b", 2)


def _four_puts(store: MemoryStore) -> None:
    store.create_session("s1")
    for i in range(4):
        store.put("s1", f"k{i}", i)


def _check_summarized_once(store: MemoryStore) -> None:
    entries = store.get_history("s1", 0)
    assert [e["op"] for e in entries] == ["summary", "put"] and entries[0]["summarized_count"] == 3


#: name -> (setup, (method, path, body), between, check). ``between`` runs after the
#: first call and changes the state so that running the write again would answer
#: differently; ``check`` then proves the write was applied once.
WRITES: dict[str, tuple[Callable, tuple[str, str, Any], Callable, Callable]] = {
    "enrich_new_session": (
        nothing,
        ("post", "enrich/", {"question": question("s1"), "run_id": "r1"}),
        lambda store: store.put("s1", "k", 1),
        lambda store: history_ops(store) == ["put"],
    ),
    "enrich_live_session": (  # the script's fast path must record too
        lambda store: store.put("s1", "k", 1) if store.create_session("s1") else None,
        ("post", "enrich/", {"question": question("s1")}),
        lambda store: store.put("s1", "k2", 2),
        lambda store: store.get_all("s1") == {"k": 1, "k2": 2},
    ),
    "store": (
        nothing,
        ("post", "store/", {"answer": answer("s1")}),
        nothing,
        lambda store: store.get("s1", "answer_count") == 1 and len(history_ops(store)) == 2,
    ),
    "store_by_run_id": (
        lambda store: store.enrich("s1", run_id="r1"),
        ("post", "store/", {"answer": answer(None), "run_id": "r1"}),
        nothing,
        lambda store: store.get("s1", "answer_count") == 1,
    ),
    "process": (
        nothing,
        (
            "post",
            "process/",
            {
                "entries": [
                    {"lane": "questions", "entry": question("s1")},
                    {"lane": "answers", "entry": answer(None)},
                ]
            },
        ),
        nothing,
        lambda store: store.get("s1", "answer_count") == 1,
    ),
    "sessions_create": (
        nothing,
        ("post", "sessions/", {"session_id": "s1", "ttl_hours": 2}),
        lambda store: store.delete_session("s1"),
        lambda store: store.list_sessions() == [],
    ),
    "session_delete": (
        _created_with_a,
        ("delete", "sessions/s1/", None),
        _recreated_with_b,
        lambda store: store.get_all("s1") == {"b": 2},
    ),
    "memory_clear": (
        _created_with_a,
        ("delete", "sessions/s1/memory/", None),
        lambda store: store.put("s1", "b", 2),
        lambda store: store.get_all("s1") == {"b": 2},
    ),
    "key_put": (
        lambda store: store.create_session("s1"),
        ("put", "sessions/s1/memory/k/", {"value": {"n": 1}}),
        lambda store: store.put("s1", "k", 2),
        lambda store: store.get("s1", "k") == 2 and history_ops(store) == ["put", "put"],
    ),
    "key_delete": (
        _created_with_a,
        ("delete", "sessions/s1/memory/a/", None),
        lambda store: store.put("s1", "a", 3),
        lambda store: store.get("s1", "a") == 3,
    ),
    "increment": (
        lambda store: store.create_session("s1"),
        ("post", "sessions/s1/memory/n/increment/", {"amount": 5}),
        nothing,
        lambda store: store.get("s1", "n") == 5 and history_ops(store) == ["increment"],
    ),
    "summarize": (
        _four_puts,
        ("post", "sessions/s1/summarize/", {"max_history": 2}),
        nothing,
        _check_summarized_once,
    ),
}


@pytest.mark.parametrize("name", WRITES)
def test_a_write_sent_again_gets_its_first_answer_and_is_applied_once(alice, name):
    setup, (method, path, body), between, check = WRITES[name]
    store = alice.store
    setup(store)
    first = alice.send(method, path, body, key=KEY)
    assert first.status_code in (200, 201), first.content
    between(store)
    again = alice.send(method, path, body, key=KEY)
    assert (again.status_code, again.json()) == (first.status_code, first.json())
    assert check(store) in (None, True)
    # Without a key the same request is applied again, as before.
    if name == "increment":
        assert alice.send(method, path, body).json() == {"value": 10}


def test_a_key_used_for_another_request_is_422_and_writes_nothing(alice):
    alice.store.create_session("s1")
    url = "sessions/s1/memory/n/increment/"
    assert alice.send("post", url, {"amount": 1}, key=KEY).json() == {"value": 1}
    for method, path, body in [
        ("post", url, {"amount": 2}),  # another body
        ("post", "sessions/s1/memory/m/increment/", {"amount": 1}),  # another path
        ("put", "sessions/s1/memory/n/", {"value": 1}),  # another method and endpoint
        ("post", "store/", {"answer": answer("s1")}),
    ]:
        assert error_of(alice.send(method, path, body, key=KEY)) == (422, "idempotency_key_reused")
    assert alice.store.get_all("s1") == {"n": 1}
    # The same body spelled differently is the same request.
    response = alice.client.generic(
        "POST", API + url, '{ "amount" :1 }', content_type="application/json", HTTP_IDEMPOTENCY_KEY=KEY
    )
    assert response.json() == {"value": 1}
    assert alice.store.get("s1", "n") == 1


def test_keys_are_per_owner(alice, bob):
    for caller in (alice, bob):
        caller.store.create_session("s1")
    url = "sessions/s1/memory/n/increment/"
    assert alice.send("post", url, {"amount": 5}, key=KEY).json() == {"value": 5}
    # Bob's request under the same key is his own: neither alice's answer nor a reuse.
    assert bob.send("post", url, {"amount": 5}, key=KEY).json() == {"value": 5}
    assert bob.send("post", url, {"amount": 7}, key="bob-2").json() == {"value": 12}
    assert bob.send("post", url, {"amount": 5}, key=KEY).json() == {"value": 5}
    assert alice.store.get("s1", "n") == 5 and bob.store.get("s1", "n") == 12


def test_a_key_is_forgotten_after_its_ttl(alice, configure):
    # Long enough for the retry to come before the key expires; then the store's own
    # expiry (a TTL after the answer, at the latest) is waited for.
    configure(IDEMPOTENCY_TTL_SECONDS=LIVE_TTL)
    alice.store.create_session("s1")
    url = "sessions/s1/memory/n/increment/"
    assert alice.send("post", url, {}, key=KEY).json() == {"value": 1}
    assert alice.send("post", url, {}, key=KEY).json() == {"value": 1}
    wait_past(time.time() + LIVE_TTL)
    assert alice.send("post", url, {}, key=KEY).json() == {"value": 2}
    assert alice.send("post", url, {"amount": 3}, key=KEY).status_code == 422  # recorded anew


@pytest.mark.parametrize("bad", ["", "has space", "a~b", "a#1", "x" * 256, "{tag}", "a*", "é"])
def test_a_malformed_key_is_400_and_writes_nothing(alice, bad):
    response = alice.send("post", "sessions/", {"session_id": "s1"}, key=bad)
    assert error_of(response) == (400, "invalid_idempotency_key")
    # Also where the request would write nothing (a skipped question).
    response = alice.send("post", "enrich/", {"question": {"text": "q"}}, key=bad)
    assert error_of(response) == (400, "invalid_idempotency_key")
    assert alice.store.list_sessions() == []


def test_a_failed_write_is_not_recorded(alice):
    alice.store.create_session("s1")
    alice.store.put("s1", "n", "text")
    url = "sessions/s1/memory/n/increment/"
    assert error_of(alice.send("post", url, {}, key=KEY)) == (400, "not_a_number")
    alice.store.put("s1", "n", 1)
    assert alice.send("post", url, {}, key=KEY).json() == {"value": 2}
    assert alice.send("post", url, {}, key=KEY).json() == {"value": 2}


def test_a_batch_retried_after_a_failure_applies_only_what_was_not_done(alice):
    store = alice.store
    store.create_session("s2")
    store.put("s2", "answer_count", "not a number")
    body = {
        "entries": [
            {"lane": "answers", "entry": answer("s1", "one")},
            {"lane": "answers", "entry": answer("s2", "two")},
            {"lane": "answers", "entry": answer("s3", "three")},
        ]
    }
    first = alice.send("post", "process/", body, key=KEY)
    assert error_of(first) == (400, "not_a_number")
    done = first.json()["completed"]
    store.put("s2", "answer_count", 0)
    again = alice.send("post", "process/", body, key=KEY)
    assert again.status_code == 200
    assert again.json()["entries"][:1] == done
    assert [item["memory"]["answer_count"] for item in again.json()["entries"]] == [1, 1, 1]
    assert [store.get(sid, "answer_count") for sid in ("s1", "s2", "s3")] == [1, 1, 1]
    assert alice.send("post", "process/", body, key=KEY).json() == again.json()
    other = {"entries": body["entries"][:1]}  # another batch under the same key
    assert error_of(alice.send("post", "process/", other, key=KEY)) == (422, "idempotency_key_reused")


def test_a_record_outlives_its_session_and_the_sweep(alice):
    alice.store.create_session("s1")
    url = "sessions/s1/memory/n/increment/"
    assert alice.send("post", url, {}, key=KEY).json() == {"value": 1}
    alice.store.delete_session("s1")
    for prefix in ("", "~o:user:4242~"):
        counts = get_store().backend.sweep(dry_run=False, batch_size=10, prefix=prefix)
        assert counts == {"expired_sessions": 0, "leftover_keys": 0, "run_bindings": 0}
    assert alice.send("post", url, {}, key=KEY).json() == {"value": 1}
    assert alice.store.list_sessions() == []


def test_64_bit_answers_replay_exactly(alice):
    alice.store.create_session("s1")
    alice.store.put("s1", "n", 2**63 - 2)
    url = "sessions/s1/memory/n/increment/"
    assert alice.send("post", url, {}, key=KEY).json() == {"value": 2**63 - 1}
    assert alice.send("post", url, {}, key=KEY).json() == {"value": 2**63 - 1}


def test_python_callers_pass_an_idempotency(store):
    once = Idempotency.of("job-17", "increment", "s1", "n")
    for scoped in (store, store.for_owner("tenant:acme")):
        scoped.create_session("s1")
        assert scoped.increment("s1", "n", idempotency=once) == 1
        assert scoped.increment("s1", "n", idempotency=once) == 1
        with pytest.raises(IdempotencyKeyReused):
            scoped.increment("s1", "n", 2, idempotency=Idempotency.of("job-17", "increment", "s1", "n", 2))
        assert scoped.get("s1", "n") == 1
    with pytest.raises(InvalidValue):
        store.increment("s1", "n", idempotency=("job-18", "fingerprint"))
    with pytest.raises(InvalidValue):
        store.increment("s1", "n", idempotency=Idempotency("job 18", "fingerprint"))
    assert store.get("s1", "n") == 1


# Keys and fingerprints --------------------------------------------------------------

#: A fingerprint as stored in every record (Redis keeps them for IDEMPOTENCY_TTL_SECONDS):
#: a change of the canonical JSON would refuse every retry of a request made before.
GOLDEN_REQUEST = ("POST", "/api/memory/sessions/s1/memory/n/increment/", {"note": "x", "amount": 1})
GOLDEN_FINGERPRINT = "6f7fe9ec9334d0e71d3fe1726bf8d5ab7a21f20198dab6f256a0b8e80e63b236"


def test_the_fingerprint_is_stable_canonical_json():
    canonical = b'["POST","/api/memory/sessions/s1/memory/n/increment/",{"amount":1,"note":"x"}]'
    assert fingerprint(*GOLDEN_REQUEST) == hashlib.sha256(canonical).hexdigest() == GOLDEN_FINGERPRINT
    # Keys in another order, at any depth, ask the same.
    assert fingerprint({"b": {"y": 1, "x": [2]}, "a": 1}) == fingerprint({"a": 1, "b": {"x": [2], "y": 1}})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


@pytest.mark.parametrize("part", [float("nan"), float("inf"), object(), {1j: 1}])
def test_a_fingerprint_needs_json_parts(part):
    with pytest.raises(InvalidValue, match="fingerprint needs JSON-able parts"):
        fingerprint("post", part)


def test_the_same_body_in_another_key_order_is_the_same_request(alice):
    body = {"question": question("s1"), "run_id": "r1"}
    first = alice.send("post", "enrich/", body, key=KEY)
    assert first.status_code == 200, first.content
    again = alice.send("post", "enrich/", dict(reversed(body.items())), key=KEY)
    assert (again.status_code, again.json()) == (200, first.json())


def test_each_entry_of_a_batch_has_a_key_no_other_key_can_equal(alice):
    # Entry 1 of batch "k" is not entry 11 of batch "k1" nor a client's own key "k1".
    once = Idempotency.of("k", "batch")
    assert once.entry(1) == Idempotency("k#1", once.fingerprint)
    assert once.entry(11).key != Idempotency.of("k1", "batch").entry(1).key
    body = {"entries": [{"lane": "questions", "entry": question(f"s{i}")} for i in range(2)]}
    assert alice.send("post", "process/", body, key="k").status_code == 200
    alice.store.create_session("t")
    url = "sessions/t/memory/n/increment/"
    answers = [alice.send("post", url, {}, key=key).json() for key in ("k0", "k1", "k1")]
    assert answers == [{"value": 1}, {"value": 2}, {"value": 2}]  # new requests, not the entries


def test_the_store_refuses_what_it_cannot_record(store):
    store.create_session("s1")
    allowed = ": use 1-255 characters of letters, digits and _ . : / @ + = -."
    bad_print = "An idempotency fingerprint must be a string of 1-128 characters."
    refused = {
        ("job 1", "print"): f"Invalid Idempotency-Key 'job 1'{allowed}",
        (17, "print"): f"Invalid Idempotency-Key '17'{allowed}",
        ("job#x", "print"): f"Invalid Idempotency-Key 'job#x'{allowed}",
        ("job#1234567890", "print"): f"Invalid Idempotency-Key 'job#1234567890'{allowed}",
        ("job", ""): bad_print,
        ("job", "f" * 129): bad_print,
        ("job", 17): bad_print,
        ("job", None): bad_print,
    }
    for (key, print_), message in refused.items():
        with pytest.raises(InvalidValue) as raised:
            store.increment("s1", "n", idempotency=Idempotency(key, print_))
        assert str(raised.value) == message
    with pytest.raises(InvalidValue) as raised:
        store.increment("s1", "n", idempotency=("job", "print"))
    assert str(raised.value) == "idempotency must be an Idempotency (see Idempotency.of)."
    assert store.get_all("s1") == {}
    # An entry of a batch ("{key}#{index}") and a fingerprint of 1 or 128 characters are recorded.
    for value, (key, print_) in enumerate([("job#0", "f"), ("job#123456789", "f" * 128)], 1):
        assert store.increment("s1", "n", idempotency=Idempotency(key, print_)) == value
        assert store.increment("s1", "n", 5, idempotency=Idempotency(key, print_)) == value  # replayed
    assert store.get("s1", "n") == 2


def test_a_malformed_key_is_named_in_its_error_cut_short():
    for bad, named in [("x" * 300, "'" + "x" * 80 + "'"), ("é", "'é'"), (None, "'None'")]:
        with pytest.raises(InvalidIdempotencyKey) as raised:
            validate_idempotency_key(bad)
        assert str(raised.value) == (
            f"Invalid Idempotency-Key {named}: use 1-255 characters of letters, digits and _ . : / @ + = -."
        )
    assert validate_idempotency_key("x" * 255) == "x" * 255


# Redis only -------------------------------------------------------------------------

# Spins for ARGV[1] microseconds: Redis runs one script at a time, so commands sent
# meanwhile wait in their sockets and run afterwards (as with any long stall). Under
# Redis's busy-script-time (5 s by default), past which it answers BUSY instead.
SPIN = """
local function now() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end
local stop = now() + tonumber(ARGV[1])
while now() < stop do end
return 1
"""


@contextmanager
def busy_redis(url: str, seconds: float) -> Iterator[None]:
    """Redis busy for ``seconds`` from another connection, starting before the block.

    The script is sent, not merely started in a thread, before the block runs: its bytes
    are in Redis's socket before anything the block sends, and Redis serves its clients
    in the order their data arrived, so what the block sends waits for the script
    (a sleep meaning "the thread has sent it by now" did not hold on a loaded machine).
    """
    pool = redis.ConnectionPool.from_url(url)
    connection = pool.get_connection()
    try:
        connection.send_command("EVAL", SPIN, 0, int(seconds * 1_000_000))
        yield
        assert connection.read_response() == 1  # the script has ended
    finally:
        pool.release(connection)
        pool.disconnect()


@pytest.fixture
def redis_alice(db: Any, settings: Any, redis_client: redis.Redis, redis_url: str) -> Caller:
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url)
    return Caller(4242)


def test_a_503_whose_write_was_applied_answers_the_retry_with_the_write(
    redis_alice, redis_client, redis_url, settings
):
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url, REDIS_SOCKET_TIMEOUT=0.3)
    store = redis_alice.store
    store.create_session("s1")  # the script is loaded and a connection is in the pool
    url = "sessions/s1/memory/n/increment/"
    with busy_redis(redis_url, 4):  # ample for one request, under busy-script-time
        first = redis_alice.send("post", url, {"amount": 1}, key=KEY)
        assert error_of(first) == (503, "backend_unavailable")
        assert first["Retry-After"]
    # The client gave up, but the command had reached Redis, which ran it when free.
    value_key = "rr:memory:~o:user:4242~s1:n"
    wait_until(lambda: redis_client.get(value_key) is not None)
    assert redis_client.get(value_key) == b"1"
    again = redis_alice.send("post", url, {"amount": 1}, key=KEY)
    assert (again.status_code, again.json()) == (200, {"value": 1})
    assert store.get("s1", "n") == 1 and history_ops(store) == ["increment"]


def fcalls(client: redis.Redis) -> int:
    return library_calls(client.info("commandstats"))


@pytest.mark.parametrize("name", [name for name in WRITES if name != "process"])
def test_a_write_with_a_key_is_one_fcall(redis_alice, redis_client, name):
    setup, (method, path, body), _, _ = WRITES[name]
    redis_alice.store.list_sessions()  # the library is loaded (a call that finds it missing counts twice)
    setup(redis_alice.store)
    answers = []
    for _ in range(2):  # the first call, recorded in its script, and its replay
        before = fcalls(redis_client)
        response = redis_alice.send(method, path, body, key=KEY)
        assert fcalls(redis_client) - before == 1
        assert redis_client.exists(f"rr:memory:~o:user:4242~:idem:{KEY}")
        answers.append((response.status_code, response.json()))
    assert answers[0] == answers[1] and answers[0][0] in (200, 201)


def test_idempotency_records_expire_and_the_sweep_leaves_live_ones(redis_alice, redis_client):
    store = redis_alice.store
    store.create_session("s1")
    url = "sessions/s1/memory/n/increment/"
    assert redis_alice.send("post", url, {}, key=KEY).status_code == 200
    unowned = get_store()
    unowned.create_session("s1")
    unowned.increment("s1", "n", idempotency=Idempotency.of(KEY, "job"))
    records = {f"rr:memory:~o:user:4242~:idem:{KEY}".encode(), f"rr:memory:~idem:{KEY}".encode()}
    assert set(redis_client.keys("rr:memory:*idem*")) == records
    for record in records:
        assert 0 < redis_client.pttl(record) <= 86400 * 1000
    # Sessions gone, the records stay: not leftovers, the sweep leaves them to expire.
    store.delete_session("s1")
    unowned.delete_session("s1")
    for prefix in ("", "~o:user:4242~"):
        counts = unowned.backend.sweep(dry_run=False, batch_size=10, prefix=prefix)
        assert counts == {"expired_sessions": 0, "leftover_keys": 0, "run_bindings": 0}
    assert set(redis_client.keys("rr:memory:*idem*")) == records
