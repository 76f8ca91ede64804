"""Token counts: OpenAI's encodings counted exactly on a fixed corpus (tests/data/
token_corpus.json, computed once and committed), with no network, in this process and in
a fresh one; the "chars" estimate; a counter of your own by import string; the message
overhead documented in persistent_memory/chat/tokens.py; and each stored
message's tokenizer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
from django.core.exceptions import ImproperlyConfigured

from persistent_memory.chat.tokens import (
    IMAGE_PART_TOKENS,
    MESSAGE_OVERHEAD,
    NAME_OVERHEAD,
    TOOL_CALL_OVERHEAD,
    message_tokens,
    text_counter,
)
from persistent_memory.conversations.store import ConversationOptions
from persistent_memory.store import MemoryStore
from tests.chat import assistant, calling, result, tool_call, user

ROOT = Path(__file__).resolve().parent.parent
CORPUS = json.loads((Path(__file__).parent / "data" / "token_corpus.json").read_text(encoding="utf-8"))
TEXTS = CORPUS["texts"]
ENCODINGS = ("o200k_base", "cl100k_base")


def count_words(text: str) -> int:
    """A counter of one's own (TOKENIZER as an import string): one token a word."""
    return len(text.split())


NOT_CALLABLE = 42


@pytest.fixture
def fresh_tiktoken(monkeypatch):
    """Encodings loaded again from scratch (tiktoken and the app both keep what they load)."""
    text_counter.cache_clear()
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    yield
    text_counter.cache_clear()


@pytest.fixture
def no_network(monkeypatch):
    """Any connection but to the loopback fails, and so does any download by tiktoken."""
    connect = socket.socket.connect
    attempts: list[Any] = []

    def loopback_only(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        if self.family == socket.AF_UNIX or host in ("127.0.0.1", "::1", "localhost"):
            return connect(self, address)
        attempts.append(address)
        raise OSError(f"network access in a test: {address!r}")

    def no_download(blobpath: str) -> bytes:
        attempts.append(blobpath)
        raise OSError(f"tiktoken tried to download {blobpath}")

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    monkeypatch.setattr(tiktoken.load, "read_file", no_download)
    yield attempts
    assert attempts == []


# OpenAI's encodings ---------------------------------------------------------------------------


def test_the_corpus_is_varied():
    assert len(TEXTS) >= 20
    names = {entry["name"] for entry in TEXTS}
    assert {"emoji", "chinese", "python-code", "whitespace-runs", "special-token-text", "numbers"} <= names
    # The encodings differ on it, so a test counting with the wrong one fails.
    assert sum(entry["o200k_base"] != entry["cl100k_base"] for entry in TEXTS) >= 10


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("entry", TEXTS, ids=[entry["name"] for entry in TEXTS])
def test_counts_equal_openais_tokenizers(encoding, entry):
    assert text_counter(encoding)(entry["text"]) == entry[encoding]


def test_the_shipped_encoding_gives_the_published_token_ids(fresh_tiktoken, no_network):
    published = CORPUS["published"]
    count = text_counter(published["encoding"])  # loads the encoding from the app's files
    assert count(published["text"]) == len(published["ids"])
    encoding = tiktoken.registry.ENCODINGS[published["encoding"]]
    assert encoding.encode_ordinary(published["text"]) == published["ids"]


def test_special_tokens_in_a_text_count_as_text():
    (entry,) = [entry for entry in TEXTS if entry["name"] == "special-token-text"]
    assert "<|endoftext|>" in entry["text"]
    count = text_counter("o200k_base")
    assert count(entry["text"]) == entry["o200k_base"] > 20  # not one control token each
    assert count("<|endoftext|>") > 1


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_encodings_load_without_network(fresh_tiktoken, no_network, monkeypatch, tmp_path, encoding):
    # Nowhere else to find the files: no cache directory, and an empty temporary directory
    # (tiktoken's default cache).
    for name in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    count = text_counter(encoding)
    assert [count(entry["text"]) for entry in TEXTS] == [entry[encoding] for entry in TEXTS]
    assert "TIKTOKEN_CACHE_DIR" not in os.environ  # put back as it was
    assert list(tmp_path.iterdir()) == []


CHILD = r"""
import json, socket, sys
import tiktoken.load

def refuse(*args, **kwargs):
    raise OSError(f"network access: {args!r}")

def no_download(blobpath):
    raise OSError(f"tiktoken tried to download {blobpath}")

socket.socket.connect = refuse
socket.create_connection = refuse
tiktoken.load.read_file = no_download

from persistent_memory.chat.tokens import message_tokens, text_counter

texts = json.loads(sys.stdin.read())
counts = {name: [text_counter(name)(text) for text in texts] for name in ("o200k_base", "cl100k_base")}
counts["message"] = message_tokens({"role": "user", "content": texts[0]}, "o200k_base")
print(json.dumps(counts))
"""


def test_a_fresh_process_counts_without_network_or_caches(tmp_path):
    home, temp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temp.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR", "XDG_CACHE_HOME")
    }
    env.update(
        HOME=str(home),
        TMPDIR=str(temp),
        PYTHONPATH=str(ROOT),
        # Were anything to try a download, it would fail at once.
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
        NO_PROXY="",
    )
    texts = [entry["text"] for entry in TEXTS]
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    counts = json.loads(child.stdout)
    for encoding in ENCODINGS:
        assert counts[encoding] == [entry[encoding] for entry in TEXTS]
    assert counts["message"] == MESSAGE_OVERHEAD + TEXTS[0]["o200k_base"]
    assert list(home.iterdir()) == [] and list(temp.iterdir()) == []  # nothing cached or downloaded


def test_an_unknown_tokenizer_is_a_configuration_error(configure):
    for name in ("o300k_base", "tests.test_tokens.missing", "tests.test_tokens.NOT_CALLABLE"):
        with pytest.raises(ImproperlyConfigured, match="TOKENIZER"):
            configure(TOKENIZER=name)


# The estimate and counters of one's own -------------------------------------------------------


@pytest.mark.parametrize("entry", TEXTS, ids=[entry["name"] for entry in TEXTS])
def test_chars_counts_four_characters_a_token(entry):
    assert text_counter("chars")(entry["text"]) == (len(entry["text"]) + 3) // 4


def test_chars_through_the_store(configure):
    store = configure(TOKENIZER="chars")
    stored = store.add_messages("s1", [user("abcdefghi"), user("abcd"), user("")])["messages"]
    assert [m["tokens"] for m in stored] == [3 + 3, 3 + 1, 3 + 0]
    assert {m["tokenizer"] for m in stored} == {"chars"}


def test_a_counter_of_ones_own_by_import_string(configure):
    store = configure(TOKENIZER="tests.test_tokens.count_words")
    (stored,) = store.add_messages("s1", [user("one two three four")])["messages"]
    assert stored["tokens"] == MESSAGE_OVERHEAD + 4
    assert stored["tokenizer"] == "tests.test_tokens.count_words"
    assert store.get_context("s1")["tokens"] == MESSAGE_OVERHEAD + 4


# The message overhead -----------------------------------------------------------------------


def corpus_text(name: str) -> tuple[str, int]:
    (entry,) = [entry for entry in TEXTS if entry["name"] == name]
    return entry["text"], entry["o200k_base"]


def test_the_documented_overhead_per_message():
    english, english_tokens = corpus_text("english")
    code, code_tokens = corpus_text("python-code")
    arguments, arguments_tokens = corpus_text("json")
    assert (MESSAGE_OVERHEAD, NAME_OVERHEAD, TOOL_CALL_OVERHEAD, IMAGE_PART_TOKENS) == (3, 1, 3, 85)
    assert message_tokens(user(english), "o200k_base") == 3 + english_tokens
    assert message_tokens(user(""), "o200k_base") == 3
    # A name: its tokens plus 1 ("english" is one token of o200k_base).
    assert message_tokens(user(english, name="english"), "o200k_base") == 3 + english_tokens + 1 + 1
    # Tool calls: the function's name and arguments, plus 3 each; null content costs nothing.
    call = {"id": "c1", "type": "function", "function": {"name": "english", "arguments": arguments}}
    two = [call, {**call, "id": "c2"}]
    assert message_tokens(assistant(None, tool_calls=[call]), "o200k_base") == 3 + 3 + 1 + arguments_tokens
    assert message_tokens(assistant(code, tool_calls=two), "o200k_base") == (
        3 + code_tokens + 2 * (3 + 1 + arguments_tokens)
    )
    # Content parts: text parts' texts, 85 an image, other parts their JSON.
    audio = {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}}
    parts = [
        {"type": "text", "text": english},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "high"}},
        {"type": "text", "text": code},
        audio,
    ]
    audio_tokens = text_counter("o200k_base")(json.dumps(audio))
    assert message_tokens(user(parts), "o200k_base") == 3 + english_tokens + 85 + code_tokens + audio_tokens
    # A tool result is a message like any other.
    assert message_tokens(result("c1", english), "o200k_base") == 3 + english_tokens


def test_stored_tokens_follow_the_overhead(store):
    english, english_tokens = corpus_text("english")
    chinese, chinese_tokens = corpus_text("chinese")
    stored = store.add_messages(
        "s1",
        [
            user(english, name="english"),
            assistant(None, tool_calls=[tool_call("c1", "english", chinese)]),
            result("c1", chinese),
        ],
    )["messages"]
    assert [m["tokens"] for m in stored] == [
        3 + english_tokens + 1 + 1,
        3 + 3 + 1 + chinese_tokens,
        3 + chinese_tokens,
    ]
    window = store.get_context("s1")
    assert window["tokens"] == sum(m["tokens"] for m in stored)
    assert sum(info["tokens"] for info in store.list_conversations("s1")) == window["tokens"]


# Each message's tokenizer ---------------------------------------------------------------------


def test_each_message_records_the_tokenizer_that_counted_it(store):
    text, o200k = corpus_text("russian")
    (entry,) = [entry for entry in TEXTS if entry["text"] == text]
    cl100k_store = MemoryStore(
        store.backend, conversation_options=ConversationOptions(tokenizer="cl100k_base")
    )
    chars_store = MemoryStore(store.backend, conversation_options=ConversationOptions(tokenizer="chars"))
    first = store.add_messages("s1", [user(text)])["messages"][0]
    second = cl100k_store.add_messages("s1", [user(text)])["messages"][0]
    third = chars_store.add_messages("s1", [calling("c1")])["messages"][0]
    assert (first["tokenizer"], first["tokens"]) == ("o200k_base", 3 + o200k)
    assert (second["tokenizer"], second["tokens"]) == ("cl100k_base", 3 + entry["cl100k_base"])
    assert (third["tokenizer"], third["tokens"]) == ("chars", 3 + 3 + 2 + 1)  # "lookup", "{}"
    # Counted once, at append: reading with another tokenizer changes nothing.
    assert [(m["tokenizer"], m["tokens"]) for m in cl100k_store.get_messages("s1")["messages"]] == [
        ("o200k_base", 3 + o200k),
        ("cl100k_base", 3 + entry["cl100k_base"]),
        ("chars", 9),
    ]
    assert chars_store.get_context("s1")["tokens"] == first["tokens"] + second["tokens"] + third["tokens"]
