"""Fuzz the REST API from its own OpenAPI schema, on both backends.

Schemathesis turns the schema the demo site serves at ``/api/schema/`` into valid and
invalid requests (bodies, path and query parameters, credentials) for every
operation; hand-written Hypothesis tests add sequences of plausible calls on ids
short enough to hit the sessions and keys seeded before each example, and on the
seeded conversation (appends, branches, tool results, head moves, windows, clears). Whatever
comes in, the API must never answer a 5xx, and everything under ``/api/memory/``
must be JSON (never Django's HTML error pages).

Bodies also carry what no value can be (lone surrogates, NaN, infinities and
``1e400``, JSON nested 990 levels deep) in values, answer texts and every field the
lanes echo back, and U+0000 in every string field: refused with a 400 and its code
before anything is written, or (U+0000) accepted and answered back.

Every example starts from the same seeded state, so a failure shrinks and replays.
Failures are collected over all operations and reported together, each with the
request and the server's traceback.
"""

from __future__ import annotations

import json
import re
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
import requests
import schemathesis
from django.contrib.auth import get_user_model
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode

from persistent_memory.store import MemoryStore, get_store, reset_store
from persistent_memory.validation import INT64_MAX, INT64_MIN

pytestmark = pytest.mark.django_db

API = "/api/memory/"
SERVER = "http://testserver"

#: Examples per operation and generation mode (schemathesis), and for the hand-written test.
SCHEMA_EXAMPLES = 25
CALL_EXAMPLES = 100

FUZZ_SETTINGS = settings(
    max_examples=SCHEMA_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

#: What every example starts from: session -> {key: value} (``count`` is a counter).
SEEDED: dict[str, dict[str, Any]] = {
    "alpha": {"count": 3, "text": "hello", "obj": {"city": "Paris"}, "top": INT64_MAX, "bottom": INT64_MIN},
    "beta": {},
    "0": {"0": 0, "stored": "x"},
    "a": {"count": 1, "text": "hi", "top": INT64_MAX, "bottom": INT64_MIN, "n": None, "list": [1, "two"]},
    "ab": {},
    "abc": {"k": "v"},
}
#: A conversation of "alpha": a question, a tool call with its result, and an answer.
SEEDED_MESSAGES: list[dict[str, Any]] = [
    {"id": "m1", "role": "user", "content": "Weather?"},
    {
        "id": "m2",
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}],
    },
    {"id": "m3", "role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"id": "m4", "role": "assistant", "content": "Sunny."},
]
#: Sessions created with a TTL: one that lasts, one that has expired when the requests arrive.
TTL_SESSIONS = {"ttl": 3600, "z": 0.001}
SEEDED_PAIRS = [(sid, key) for sid, values in SEEDED.items() for key in values] + [("beta", "missing")]
AUTH_MODES = ["token", "token", "token", "generated", "none"]
ACCEPTS = ["*/*", "*/*", "*/*", "application/json", "text/html", "text/html,application/xhtml+xml,*/*;q=0.8"]


def seed(store: MemoryStore) -> None:
    for session_id, values in SEEDED.items():
        store.create_session(session_id)
        for key, value in values.items():
            if key == "count":
                store.increment(session_id, key, value)
            else:
                store.put(session_id, key, value)
    store.add_messages("alpha", SEEDED_MESSAGES)
    store.create_session("ttl", ttl_seconds=TTL_SESSIONS["ttl"])
    store.put("ttl", "k", 1)
    store.create_session("z", ttl_seconds=TTL_SESSIONS["z"])
    time.sleep(0.003)  # "z" has expired now


@dataclass
class Sent:
    """One request as sent, for the failure report."""

    method: str
    path: str
    query: str
    body: bytes
    headers: dict[str, str]

    def __str__(self) -> str:
        query = f"?{self.query}" if self.query else ""
        body = self.body[:2000].decode("utf-8", "backslashreplace") + ("..." if len(self.body) > 2000 else "")
        headers = {k: v for k, v in self.headers.items() if k != "X-Schemathesis-TestCaseId"}
        return f"{self.method} {self.path}{query}\n  headers: {headers}\n  body: {body}"


@dataclass
class Fuzzer:
    """Sends requests through Django's test client, checks them, keeps score."""

    client: Client
    token: str
    reset: Callable[[], None]
    statuses: Counter[int] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)
    #: The ``code`` of every 4xx answer.
    codes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def send(self, sent: Sent, operation: str) -> Any:
        headers = {k: v for k, v in sent.headers.items() if k not in ("Content-Type", "Content-Length")}
        kwargs: dict[str, Any] = {}
        if sent.body:
            kwargs.update(data=sent.body, content_type=sent.headers.get("Content-Type", ""))
        path = sent.path + (f"?{sent.query}" if sent.query else "")
        response = self.client.generic(sent.method, path, headers=headers, **kwargs)
        self.statuses[response.status_code] += 1
        self.operations[operation] += 1
        problem = problem_with(sent, response)
        if problem is not None:
            raise AssertionError(problem)
        if 400 <= response.status_code < 500 and sent.path.startswith(API):
            self.codes[json.loads(response.content).get("code")] += 1
        return response


def problem_with(sent: Sent, response: Any) -> str | None:
    """Why ``response`` breaks the API's promises, or None."""
    problems = []
    if response.status_code >= 500:
        problems.append(f"status {response.status_code}")
    if sent.path.startswith(API):
        content_type = response.get("Content-Type", "")
        if not content_type.startswith("application/json"):
            problems.append(f"Content-Type {content_type!r}, not JSON")
        else:
            try:
                json.loads(response.content)
            except ValueError as exc:
                problems.append(f"body is not JSON ({exc})")
    if not problems:
        return None
    report = f"{', '.join(problems)} for\n  {sent}\n  response: {response.content[:300]!r}"
    exc_info = getattr(response, "exc_info", None)
    if exc_info:
        lines = traceback.format_exception(*exc_info)
        report += "\n  server traceback (last frames):\n" + "".join(lines[-6:])
    return report


def latin1(value: str) -> str:
    """A header value as a WSGI server hands it to Django: UTF-8 bytes read as Latin-1."""
    return value.encode("utf-8").decode("latin-1")


def sent_from_case(case: Any, auth: str, accept: str, token: str) -> Sent:
    """Serialize a schemathesis case the way it would go on the wire (via requests)."""
    headers = {"Accept": accept}
    if auth == "token":
        headers["Authorization"] = f"Token {token}"
    kwargs = case.as_transport_kwargs(base_url=SERVER, headers=headers)
    if auth == "none":
        kwargs["headers"].pop("Authorization", None)
        kwargs["cookies"] = {}
    names = ("method", "url", "headers", "params", "cookies", "json", "data", "files", "auth")
    prepared = requests.Request(**{name: kwargs[name] for name in names if name in kwargs}).prepare()
    url = urlsplit(prepared.url)
    body = prepared.body or b""
    if isinstance(body, str):
        body = body.encode("utf-8")
    skip = {"Accept-Encoding", "Connection", "User-Agent"}
    wire_headers = {name: latin1(str(value)) for name, value in prepared.headers.items() if name not in skip}
    return Sent(prepared.method or case.method, url.path, url.query, body, wire_headers)


# The schema ------------------------------------------------------------------


def load_schema(client: Client) -> Any:
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200, response.content[:500]
    return schemathesis.openapi.from_dict(json.loads(response.content))


def operations_of(schema: Any) -> list[Any]:
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 16, [op.label for op in operations]
    return operations


def strategies_for(operation: Any, mode: GenerationMode) -> Any:
    """Free generation, plus the same with path parameters naming seeded sessions and keys."""
    names = set(re.findall(r"{(\w+)}", operation.path))
    options = [operation.as_strategy(generation_mode=mode)]
    if names == {"session_id"}:
        options += [
            operation.as_strategy(generation_mode=mode, path_parameters={"session_id": sid})
            for sid in [*SEEDED, *TTL_SESSIONS]
        ]
    elif names == {"session_id", "key"}:
        options += [
            operation.as_strategy(generation_mode=mode, path_parameters={"session_id": sid, "key": key})
            for sid, key in SEEDED_PAIRS
        ]
    return st.one_of(options)


# Fixtures --------------------------------------------------------------------


@pytest.fixture
def api_token(db: Any) -> str:
    user = get_user_model().objects.create_user("fuzzer", password="not-used-here")
    return Token.objects.create(user=user).key


@pytest.fixture
def fresh_state(configure: Any, backend_name: str, request: pytest.FixtureRequest) -> Callable[[], None]:
    """A function that puts the backend back to the seeded state."""
    configure()
    redis_client = request.getfixturevalue("redis_client") if backend_name == "redis" else None

    def reset() -> None:
        if redis_client is not None:
            redis_client.flushdb()
        else:
            reset_store()  # a new, empty in-process backend
        seed(get_store())

    return reset


def summary(name: str, fuzzer: Fuzzer, started: float) -> str:
    total = sum(fuzzer.statuses.values())
    statuses = ", ".join(f"{code}: {n}" for code, n in sorted(fuzzer.statuses.items()))
    return f"{name}: {total} requests in {time.perf_counter() - started:.1f}s ({statuses})"


# Schemathesis over every operation ----------------------------------------------


def fuzz_operation(fuzzer: Fuzzer, operation: Any, mode: GenerationMode) -> None:
    """Run one operation's examples; a failure is recorded, not raised, so every operation runs."""
    if mode is GenerationMode.NEGATIVE and not (operation.body or operation.query):
        return  # only string path parameters: nothing of it can be made invalid

    @FUZZ_SETTINGS
    @given(
        case=strategies_for(operation, mode),
        auth=st.sampled_from(AUTH_MODES),
        accept=st.sampled_from(ACCEPTS),
    )
    def fuzz(case: Any, auth: str, accept: str) -> None:
        fuzzer.reset()
        fuzzer.send(sent_from_case(case, auth, accept, fuzzer.token), operation.label)

    try:
        fuzz()
    except Unsatisfiable:
        # Nothing of this operation can be made invalid (say, no parameters, body or auth).
        assert mode is GenerationMode.NEGATIVE, operation.label
    except (AssertionError, ExceptionGroup) as exc:
        group = f"{exc.message}\n" if isinstance(exc, ExceptionGroup) else ""
        for error in exc.exceptions if isinstance(exc, ExceptionGroup) else [exc]:
            detail = (
                str(error)
                if isinstance(error, AssertionError)
                else "".join(traceback.format_exception(error))
            )
            fuzzer.failures.append(f"{operation.label} [{mode.value}]: {group}{detail}")


def test_schema_fuzz_never_5xx_and_always_json(fresh_state, api_token, backend_name):
    started = time.perf_counter()
    client = Client(raise_request_exception=False)
    fuzzer = Fuzzer(client, api_token, fresh_state)
    schema = load_schema(client)

    for operation in operations_of(schema):
        for mode in GenerationMode:
            fuzz_operation(fuzzer, operation, mode)

    missing = {op.label for op in operations_of(schema)} - set(fuzzer.operations)
    print(summary(f"schema fuzz [{backend_name}]", fuzzer, started))
    assert not fuzzer.failures, "\n\n".join(fuzzer.failures)
    assert not missing, f"operations never called: {missing}"
    assert fuzzer.statuses[401] > 0 and any(200 <= code < 300 for code in fuzzer.statuses)


# Hand-written calls on ids that exist -----------------------------------------------

#: Path segments a client could send that no schema generator would (percent-encoded as sent).
ODD_SEGMENTS = ["%20", ".", "..", "%2F", "a%00b", "%E9", "%C3%A9", "a%20b", "__keys__", "a" * 129, "a:b", "*"]
short_names = st.from_regex(r"[a-z]{1,3}", fullmatch=True)
ids = st.sampled_from([*SEEDED, *TTL_SESSIONS]) | short_names | st.sampled_from(ODD_SEGMENTS)
keys = (
    short_names
    | st.sampled_from(
        ["count", "text", "obj", "top", "bottom", "n", "list", "k", "last_answer", "answer_count"]
    )
    | st.sampled_from(["a.b", "-", "_", "__history__", "a" * 257, *ODD_SEGMENTS])
)
#: Strings with what JSON can carry but a store might trip on (U+0000, characters beyond
#: U+FFFF) and what no store can hold exactly (lone surrogates: refused).
ODD_STRINGS = ["\x00", "a\x00b", "\ud800", "x\udfff", "\ude00\ud83d", "\U0001f600", "\\u0000"]
texts = (
    st.text(max_size=8)
    | st.sampled_from(ODD_STRINGS)
    | st.text(st.characters() | st.characters(categories=["Cs"]) | st.just("\x00"), max_size=4)
)
json_values = st.recursive(
    # NaN and the infinities go out as NaN/Infinity literals (refused).
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
)
numbers = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([INT64_MAX, INT64_MIN, INT64_MAX + 1, INT64_MIN - 1, 2**100, -(2**100), 10**400]),
    st.integers(),
    st.floats(allow_nan=False),
    st.sampled_from(["1", "", "x", "1e3", True, None, [], {}]),
)
body_ids = (
    st.none()
    | short_names
    | st.sampled_from(
        [*SEEDED, *TTL_SESSIONS, "", "__keys__", "a b", "é", "a" * 129, 1, ["a"], "a\x00", "\ud800"]
    )
)
message_ids = st.sampled_from(["m1", "m2", "m3", "m4", "m5", "", "a b", "a" * 129, None, 1, "\x00"])
conversation_names = st.sampled_from(["default", "c", "", "a b", "__x__", None, 5])


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "w", "arguments": "{}"}}


good_tool_calls = st.sampled_from([[_call("call_1")], [_call("call_2")], [_call("call_2"), _call("call_3")]])
tool_calls = good_tool_calls | st.sampled_from(
    [[{"id": "call_2", "type": "function", "function": {"name": "w"}}], [], "call"]
)
#: Ids of the seeded messages, and new ones.
seeded_ids = st.sampled_from(["m1", "m2", "m3", "m4"])
good_ids = seeded_ids | st.sampled_from(["m5", "m6", "m7", "m8"])


@st.composite
def plausible_messages(draw: Any) -> dict[str, Any]:
    """A message the rules accept, with ids and tool call ids that meet the seeded ones."""
    role = draw(st.sampled_from(["user", "assistant", "user", "assistant", "tool", "system"]))
    message: dict[str, Any] = {"role": role, "content": draw(st.sampled_from(["hi", "Sunny.", "x" * 200]))}
    if role == "tool":
        message["tool_call_id"] = draw(st.sampled_from(["call_1", "call_2", "call_3"]))
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = draw(good_tool_calls)
        message["content"] = None
    if draw(st.integers(0, 2)) == 0:
        message["id"] = draw(good_ids)
    return message


@st.composite
def odd_messages(draw: Any) -> Any:
    """A message with odd fields and contents, mostly refused."""
    message: dict[str, Any] = {
        "role": draw(st.sampled_from(["user", "assistant", "tool", "robot", None])),
        "content": draw(texts | st.none() | json_values),
    }
    for name, values in [
        ("id", message_ids),
        ("tool_calls", tool_calls),
        ("tool_call_id", st.sampled_from(["call_1", "", 7])),
        ("metadata", st.dictionaries(texts, json_values, max_size=2) | json_values),
        ("name", st.sampled_from(["bob", "a b", ""])),
    ]:
        if draw(st.integers(0, 3)) == 0:
            message[name] = draw(values)
    return message


chat_messages = st.one_of(plausible_messages(), plausible_messages(), plausible_messages(), odd_messages())
good_conversations = st.sampled_from(["default", "default", "c"])


@st.composite
def append_bodies(draw: Any) -> Any:
    """A body for ``POST messages/``: mostly a list of plausible messages, sometimes anything."""
    odd = draw(st.integers(0, 7)) == 0
    body = {"messages": draw(json_values if odd else st.lists(chat_messages, min_size=1, max_size=3))}
    if draw(st.booleans()):
        body["conversation"] = draw(conversation_names if odd else good_conversations)
    if draw(st.booleans()):
        body["parent_id"] = draw(message_ids if odd else seeded_ids)
    return body


any_conversation = good_conversations | conversation_names
conversation_queries = st.fixed_dictionaries({}, optional={"conversation": any_conversation})
thread_queries = st.fixed_dictionaries(
    {}, optional={"conversation": any_conversation, "leaf": good_ids | message_ids, "limit": numbers}
)
context_queries = st.fixed_dictionaries(
    {}, optional={"conversation": any_conversation, "max_tokens": numbers, "max_messages": numbers}
)

run_ids = st.none() | st.sampled_from(["run-1", "run-2", "", "a b", "r" * 129, 5, "r\x00", "\udc00"])


@st.composite
def entries(draw: Any) -> Any:
    metadata = draw(st.sampled_from([{}, {"x": 1}, [], "s"]))
    if isinstance(metadata, dict) and draw(st.booleans()):
        metadata = {**metadata, "session_id": draw(body_ids)}
    entry = {"text": draw(texts | st.none() | st.integers()), "metadata": metadata}
    if draw(st.booleans()):  # fields the lanes echo back, in the entry and its metadata
        entry["extra"] = draw(json_values)
        if isinstance(metadata, dict):
            metadata = entry["metadata"] = {**metadata, draw(texts): draw(json_values)}
    return draw(
        st.sampled_from([entry, entry, entry, {"text": "only"}, {"metadata": metadata}, "text", None])
    )


@st.composite
def api_calls(draw: Any) -> tuple[str, str, Any, dict[str, Any]]:
    """(method, path, JSON body or None, query) for one plausible call."""
    sid, key = draw(ids), draw(keys)
    session, memory = f"{API}sessions/{sid}/", f"{API}sessions/{sid}/memory/"
    process = {
        "entries": draw(
            st.lists(
                st.fixed_dictionaries(
                    {"lane": st.sampled_from(["questions", "answers", "other"]), "entry": entries()}
                ),
                max_size=4,
            )
        )
    }
    page = {
        "search": draw(st.sampled_from(["", "a", sid])),
        "page": draw(numbers),
        "page_size": draw(numbers),
    }
    return draw(
        st.sampled_from(
            [
                ("GET", session, None, {}),
                ("DELETE", session, None, {}),
                ("GET", memory, None, {}),
                ("DELETE", memory, None, {}),
                ("GET", f"{memory}{key}/", None, {}),
                ("PUT", f"{memory}{key}/", {"value": draw(json_values)}, {}),
                ("PUT", f"{memory}{key}/", draw(json_values), {}),
                ("DELETE", f"{memory}{key}/", None, {}),
                ("POST", f"{memory}{key}/increment/", {"amount": draw(numbers)}, {}),
                ("POST", f"{memory}{key}/increment/", {}, {}),
                ("GET", f"{session}history/", None, {"limit": draw(numbers)}),
                ("GET", f"{session}history/", None, {}),
                ("POST", f"{session}summarize/", {"max_history": draw(numbers)}, {}),
                ("POST", f"{session}summarize/", {}, {}),
                ("POST", f"{API}sessions/", {"session_id": draw(body_ids), "ttl_hours": draw(numbers)}, {}),
                ("POST", f"{API}sessions/", {"session_id": sid}, {}),
                ("GET", f"{API}sessions/", None, page),
                ("POST", f"{API}enrich/", {"question": draw(entries()), "run_id": draw(run_ids)}, {}),
                ("POST", f"{API}store/", {"answer": draw(entries()), "run_id": draw(run_ids)}, {}),
                ("POST", f"{API}process/", process, {}),
                ("GET", f"{API}health/", None, {}),
                ("PATCH", f"{memory}{key}/", {"value": 1}, {}),  # not allowed: a JSON 405
                ("GET", f"{session}{key}", None, {}),  # no trailing slash: a JSON 404
            ]
        )
    )


#: JSON text that no value can be, put in an extra field of a body (or beside it in a list).
POISONS = {
    "1e400": b"1e400",  # Python parses it to inf
    "990 deep": b"[" * 990 + b"]" * 990,
    "too deep": b"[" * 101 + b"]" * 101,  # MAX_JSON_DEPTH + 1
    "surrogate": b'"\\udfff"',
}
MARKER = "poison-marker"


def planted(body: Any) -> Any:
    """``body`` with :data:`MARKER` as every ``value`` and as an extra field of every object
    (an entry the lanes echo back, its metadata, the body itself)."""
    if isinstance(body, dict):
        return {
            **{key: MARKER if key == "value" else planted(item) for key, item in body.items()},
            "x": MARKER,
        }
    if isinstance(body, list):
        return [planted(item) for item in body]
    return body


#: How a body goes on the wire: mostly proper JSON, sometimes broken, poisoned or mislabelled.
ENCODINGS = ["json"] * 12 + [
    "truncated",
    "nan",
    "not utf-8",
    "form",
    "no content type",
    "huge",
    *POISONS,
    *POISONS,
]


def encode(body: Any, encoding: str) -> tuple[bytes, str]:
    """The body bytes and Content-Type for ``encoding``."""
    if encoding == "huge":
        return b'{"value": "' + b"x" * (3 * 1024 * 1024) + b'"}', "application/json"
    if encoding in POISONS:
        data = json.dumps(planted(body)).encode().replace(json.dumps(MARKER).encode(), POISONS[encoding])
        return data, "application/json"
    data = json.dumps(body).encode()
    if encoding == "truncated":
        return data[:-1], "application/json"
    if encoding == "nan":
        return b'{"value": NaN, "amount": Infinity}', "application/json"
    if encoding == "not utf-8":
        return b'{"value": "\xff\xfe"}', "application/json"
    if encoding == "form":
        return b"value=1&amount=2", "application/x-www-form-urlencoded"
    if encoding == "no content type":
        return data, ""
    return data, "application/json"


def test_calls_on_seeded_ids_never_5xx(configure, fresh_state, backend_name):
    """Open auth (AllowAny, no authenticators, the one shared namespace, where the seeded
    sessions are) and a short history, so summaries happen."""
    configure(
        API_PERMISSION_CLASSES=["rest_framework.permissions.AllowAny"],
        API_AUTHENTICATION_CLASSES=[],
        OWNER_RESOLVER="persistent_memory.owners.resolvers.shared_owner",
        MAX_HISTORY=6,
    )
    started = time.perf_counter()
    fuzzer = Fuzzer(Client(raise_request_exception=False), "", fresh_state)

    @settings(FUZZ_SETTINGS, max_examples=CALL_EXAMPLES)
    @given(calls=st.lists(st.tuples(api_calls(), st.sampled_from(ENCODINGS)), min_size=1, max_size=6))
    def fuzz(calls: list[tuple[tuple[str, str, Any, dict[str, Any]], str]]) -> None:
        fuzzer.reset()
        for (method, path, body, query), encoding in calls:
            headers = {"Accept": "application/json"}
            data = b""
            if body is not None:
                data, headers["Content-Type"] = encode(body, encoding)
            params = {name: v if isinstance(v, str) else json.dumps(v) for name, v in query.items()}
            fuzzer.send(Sent(method, path, urlencode(params), data, headers), f"{method} {path}")

    try:
        fuzz()
        # Each kind of body the store cannot hold once more, whatever the draws were (they
        # differ between Python versions): the codes asserted below are always exercised.
        for encoding in ("truncated", "nan", "too deep", "surrogate"):
            data, content_type = encode({"value": 1}, encoding)
            sent = Sent("PUT", f"{API}sessions/alpha/memory/k/", "", data, {"Content-Type": content_type})
            fuzzer.send(sent, f"PUT {API}sessions/alpha/memory/k/ ({encoding})")
    finally:
        print(summary(f"seeded calls [{backend_name}]", fuzzer, started))
    assert fuzzer.statuses[200] > 0 and fuzzer.statuses[404] > 0 and fuzzer.statuses[400] > 0
    # Every kind of JSON the store cannot hold was sent, and refused with its code.
    assert {"invalid_json", "json_too_deep", "invalid_unicode", "parse_error"} <= set(fuzzer.codes), (
        fuzzer.codes
    )


@st.composite
def conversation_calls(draw: Any) -> tuple[str, str, Any, dict[str, Any]]:
    """(method, path, JSON body or None, query) for one call on a conversation, mostly of
    "alpha" (seeded with a tool call) and mostly plausible."""
    sid = draw(st.sampled_from(["alpha", "alpha", "alpha", "beta", "new", "z", "a b"]))
    session = f"{API}sessions/{sid}/"
    return draw(
        st.sampled_from(
            [
                ("POST", f"{session}messages/", draw(append_bodies()), {}),
                ("POST", f"{session}messages/", draw(append_bodies()), {}),
                ("GET", f"{session}messages/", None, draw(thread_queries)),
                ("GET", f"{session}context/", None, draw(context_queries)),
                ("GET", f"{session}conversations/", None, {}),
                ("PUT", f"{session}head/", {"message_id": draw(good_ids | message_ids)}, {}),
                ("PUT", f"{session}head/", {"message_id": draw(good_ids), "conversation": "c"}, {}),
                ("DELETE", f"{session}messages/", None, draw(conversation_queries)),
            ]
        )
    )


def test_conversation_calls_never_5xx(configure, fresh_state, backend_name):
    """Sequences of conversation calls (appends on branches, tool results, head moves, windows,
    clears) on the seeded conversation, with open auth as above."""
    configure(
        API_PERMISSION_CLASSES=["rest_framework.permissions.AllowAny"],
        API_AUTHENTICATION_CLASSES=[],
        OWNER_RESOLVER="persistent_memory.owners.resolvers.shared_owner",
        MAX_MESSAGES=8,
    )
    started = time.perf_counter()
    fuzzer = Fuzzer(Client(raise_request_exception=False), "", fresh_state)

    @settings(FUZZ_SETTINGS, max_examples=CALL_EXAMPLES)
    @given(calls=st.lists(conversation_calls(), min_size=1, max_size=8))
    def fuzz(calls: list[tuple[str, str, Any, dict[str, Any]]]) -> None:
        fuzzer.reset()
        for method, path, body, query in calls:
            headers = {"Accept": "application/json"}
            data = b""
            if body is not None:
                data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
            params = {name: v if isinstance(v, str) else json.dumps(v) for name, v in query.items()}
            fuzzer.send(Sent(method, path, urlencode(params), data, headers), f"{method} {path}")
        # Whatever happened, the window is whole: no tool result without its call.
        window = get_store().get_context("alpha")["messages"]
        calls_seen = {c["id"] for m in window for c in m.get("tool_calls") or ()}
        assert all(m["tool_call_id"] in calls_seen for m in window if m["role"] == "tool"), window

    try:
        fuzz()
    finally:
        print(summary(f"conversation calls [{backend_name}]", fuzzer, started))
    assert fuzzer.statuses[200] > 0 and fuzzer.statuses[201] > 0 and fuzzer.statuses[404] > 0
    assert {"invalid_message", "orphan_tool_result", "message_not_found", "session_not_found"} <= set(
        fuzzer.codes
    ), fuzzer.codes


# Bodies the store cannot hold, on every endpoint that takes one -----------------------

#: A body each endpoint accepts, with MARKER where the poison goes: a value, an answer's
#: text, a field of an entry or its metadata (echoed back), a field nobody reads.
POISON_TARGETS: list[tuple[str, str, Any]] = [
    ("PUT", "sessions/alpha/memory/text/", {"value": MARKER}),
    ("PUT", "sessions/alpha/memory/text/", {"value": {"a": [1, MARKER]}}),
    ("POST", "enrich/", {"question": {"text": "q", "metadata": {"session_id": "alpha"}, "x": MARKER}}),
    ("POST", "enrich/", {"question": {"text": MARKER, "metadata": {"session_id": "new", "x": MARKER}}}),
    ("POST", "store/", {"answer": {"text": MARKER, "metadata": {"session_id": "alpha"}}}),
    ("POST", "store/", {"answer": {"text": "a", "metadata": {"session_id": "new"}, "x": MARKER}}),
    (
        "POST",
        "process/",
        {
            "entries": [
                {"lane": "questions", "entry": {"text": "q", "metadata": {"session_id": "new"}}},
                {"lane": "answers", "entry": {"text": MARKER, "x": [MARKER]}},
            ]
        },
    ),
    ("POST", "sessions/", {"session_id": "new", "ttl_hours": 1, "x": MARKER}),
    ("POST", "sessions/alpha/memory/count/increment/", {"amount": 1, "x": MARKER}),
    ("POST", "sessions/alpha/summarize/", {"max_history": 1, "x": MARKER}),
    ("POST", "sessions/alpha/messages/", {"messages": [{"role": "user", "content": MARKER}]}),
    (
        "POST",
        "sessions/alpha/messages/",
        {"messages": [{"role": "assistant", "content": "a", "metadata": {"k": [MARKER]}}], "x": MARKER},
    ),
    ("PUT", "sessions/alpha/head/", {"message_id": "m1", "x": MARKER}),
]
poisons = st.one_of(
    json_values.map(lambda value: json.dumps(value).encode()),  # NaN, surrogates, U+0000...
    st.sampled_from(list(POISONS.values())),
    st.integers(95, 1000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.sampled_from([b"1e400", b"-1e999", b"1" + b"0" * 400 + b".5", b"NaN", b"-Infinity", b'"\\uD800"']),
)


def stored_state() -> tuple[Any, ...]:
    store = get_store()
    conversation = store.get_messages("alpha"), store.list_conversations("alpha")
    return store.list_sessions(), store.get_all("alpha"), store.get_history("alpha", 0), conversation


def test_poisoned_bodies_never_5xx_and_write_nothing_when_refused(configure, fresh_state, backend_name):
    configure(
        API_PERMISSION_CLASSES=["rest_framework.permissions.AllowAny"],
        API_AUTHENTICATION_CLASSES=[],
        OWNER_RESOLVER="persistent_memory.owners.resolvers.shared_owner",
    )
    started = time.perf_counter()
    fuzzer = Fuzzer(Client(raise_request_exception=False), "", fresh_state)

    @settings(FUZZ_SETTINGS, max_examples=CALL_EXAMPLES)
    @given(target=st.sampled_from(POISON_TARGETS), poison=poisons)
    def fuzz(target: tuple[str, str, Any], poison: bytes) -> None:
        fuzzer.reset()
        before = stored_state()
        method, path, body = target
        data = json.dumps(body).encode().replace(json.dumps(MARKER).encode(), poison)
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        response = fuzzer.send(Sent(method, API + path, "", data, headers), f"{method} {path}")
        if response.status_code >= 400:
            assert stored_state() == before, f"{method} {path} {data[:300]!r} wrote, then answered an error"

    try:
        fuzz()
    finally:
        print(summary(f"poisoned bodies [{backend_name}]", fuzzer, started))
    assert {"invalid_json", "json_too_deep", "invalid_unicode"} <= set(fuzzer.codes), fuzzer.codes
    assert any(200 <= code < 300 for code in fuzzer.statuses)
