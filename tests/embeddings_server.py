"""A small local server that speaks OpenAI's embeddings protocol, standing in for a model
provider (none is reachable from the test machines): ``POST /v1/embeddings`` answers an
``embeddings`` list, or what the test scripted (an HTTP error, a delay, no answer at
all: ``Script(hang=True)`` holds the request until the test calls :meth:`recover` or
the server stops, then closes the connection without a word).

Its "model" embeds a text as the sum of its words' concepts: ``CONCEPTS`` maps a word to
a concept (its dimension), so "python" and "language" can lie close while sharing no
letters; other words fall into hashed dimensions of their own. Vectors are answered in
reverse order of the inputs, each with its index, as the API allows."""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.chat_server import HANG, JSONHandler, serving

#: Words of one concept share a dimension.
CONCEPTS = {
    **dict.fromkeys(["python", "java", "language", "languages", "scripting", "programming", "code"], 0),
    **dict.fromkeys(["dark", "light", "theme", "mode", "colours", "colors"], 1),
    **dict.fromkeys(["coffee", "tea", "drink", "espresso", "beverage"], 2),
    **dict.fromkeys(["dog", "cat", "pet", "puppy"], 3),
    **dict.fromkeys(["berlin", "paris", "city", "live", "lives", "home"], 4),
}
DIMENSIONS = 16
_WORDS = re.compile(r"\w+")


def embed_text(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """The stand-in model's unit vector of ``text``."""
    vector = [0.0] * dimensions
    for word in _WORDS.findall(text.casefold()):
        if word in CONCEPTS:
            vector[CONCEPTS[word] % dimensions] += 1.0
        else:  # a word of no concept: a little weight in a hashed dimension past the concepts
            spare = dimensions - 5
            vector[5 + int(hashlib.sha256(word.encode()).hexdigest(), 16) % spare] += 0.5
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


@dataclass
class Script:
    """One answer: a status other than 200 is an error; ``delay`` seconds before it;
    ``hang``: none (see the module's docstring)."""

    status: int = 200
    delay: float = 0.0
    hang: bool = False


@dataclass
class EmbeddingsServer:
    url: str = ""
    #: Answers in order; the last one repeats.
    script: list[Script] = field(default_factory=lambda: [Script()])
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Set by :meth:`recover` (and at exit): the requests held by a hang end unanswered.
    released: threading.Event = field(default_factory=threading.Event)

    def answer(self) -> Script:
        with self.lock:
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def hang(self) -> None:
        """Answer no request from now on (until :meth:`recover`)."""
        with self.lock:
            self.released.clear()
            self.script = [Script(hang=True)]

    def recover(self) -> None:
        """Answer every request again; the ones held are dropped unanswered."""
        with self.lock:
            self.script = [Script()]
            self.released.set()


def _handler(state: EmbeddingsServer) -> type[JSONHandler]:
    class Handler(JSONHandler):
        def do_POST(self) -> None:
            body = self.read_recorded(state.requests, state.lock)
            script = state.answer()
            if script.hang:
                state.released.wait(HANG)
                self.close_connection = True
                return
            if script.delay:
                time.sleep(script.delay)
            if self.path != "/v1/embeddings":
                self.send_json(404, {"error": {"message": "Not found", "type": "invalid_request_error"}})
                return
            if script.status != 200:
                self.send_json(
                    script.status, {"error": {"message": f"Scripted {script.status}", "type": "server_error"}}
                )
                return
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            dimensions = body.get("dimensions") or DIMENSIONS
            data = [
                {"object": "embedding", "index": index, "embedding": embed_text(text, dimensions)}
                for index, text in enumerate(texts)
            ]
            self.send_json(
                200,
                {
                    "object": "list",
                    "data": data[::-1],
                    "model": body.get("model", ""),
                    "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)},
                },
            )

    return Handler


@contextmanager
def embeddings_server() -> Iterator[EmbeddingsServer]:
    """A running server on a free loopback port; ``url`` ends with ``/v1``."""
    state = EmbeddingsServer()
    try:
        with serving(_handler(state), "embeddings-server") as state.url:
            yield state
    finally:
        state.released.set()
