"""A deterministic, *extractive* stand-in for a model behind OpenAI's chat-completions
protocol, for the recall bench's ``recorded_llm`` setup (no model is reachable from the
bench machines).

    python bench/llm_standin.py [--port 8765]   # serves http://127.0.0.1:8765/v1 until ^C

``POST /v1/chat/completions`` takes what
:class:`persistent_memory.memories.extraction.chat_completions.ChatCompletionsExtractor`
sends (a system prompt, then one user message holding the transcript, one line per message:
``[id] date time name (role): text``, the date, time and name where known) and answers a
``ChatCompletion`` whose text is the JSON array that extractor parses: one item per turn
that states something,

    {"type": "factual", "key": "said.<name>.<id>",
     "content": "<Name> said on <date>: <text>", "messages": ["<id>"]}

A turn states something when, leaving out its questions (sentences ending in ``?``) and
its greetings (sentences opening with one of :data:`GREETINGS`), at least
:data:`MIN_WORDS` words remain; a line without an id is skipped (there would be no turn
to cite). The content keeps the turn's whole text, with the speaker's name (the role
where the line has none) and the date where the line has one.

What this measures is the pipeline, not a model's judgement: transcript -> request ->
answer parsed and checked -> memories written -> searched -> the cited turns found
again, and whether ids, names and dates survive each step. A real model picks fewer,
shorter facts, words them differently and gives a changed fact the same key as the
statement it replaces; this one copies every statement under a key of its own. Its
recall figures are therefore an upper bound of what the plumbing keeps, not a forecast
of what a model would reach.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: Sentences opening with one of these words are greetings, not statements.
GREETINGS = frozenset(("hi", "hello", "hey", "morning", "evening", "thanks", "thank", "bye", "cheers"))
#: The fewest words (outside questions and greetings) of a turn that states something.
MIN_WORDS = 5
#: ``[id] 2023-05-08 14:03 Caroline (user): text`` (date, time and name where known).
LINE = re.compile(
    r"^\[(?P<id>[^\]]*)\] (?:(?P<date>\d{4}-\d{2}-\d{2}) \d{2}:\d{2} )?"
    r"(?:(?P<name>.+?) \((?P<role>user|assistant)\)|(?P<bare>user|assistant)): (?P<text>.*)$"
)
_SENTENCE = re.compile(r"[^.!?]+[.!?]*")
_WORD = re.compile(r"[A-Za-z0-9']+")
_SLUG = re.compile(r"[^a-z0-9]+")


def states_something(text: str) -> bool:
    """Whether ``text`` holds :data:`MIN_WORDS` words outside its questions and greetings."""
    words = 0
    for sentence in (s.strip() for s in _SENTENCE.findall(text)):
        found = _WORD.findall(sentence)
        if not found or sentence.endswith("?") or found[0].casefold() in GREETINGS:
            continue
        words += len(found)
    return words >= MIN_WORDS


def memories(transcript: str) -> list[dict[str, Any]]:
    """The items an extractive model answers for ``transcript`` (see the module's docstring)."""
    items = []
    for line in transcript.splitlines():
        said = LINE.match(line)
        if said is None or said["id"] in ("", "-") or not states_something(said["text"]):
            continue
        who = said["name"] or said["bare"]
        when = f" on {said['date']}" if said["date"] else ""
        slug = _SLUG.sub("-", who.casefold()).strip("-") or "someone"
        items.append(
            {
                "type": "factual",
                "key": f"said.{slug}.{said['id']}",
                "content": f"{who} said{when}: {said['text']}",
                "messages": [said["id"]],
            }
        )
    return items


def answer(body: Any) -> str:
    """The completion's text for a request ``body``; ValueError when it is not one the
    extractor sends (a system message, then the transcript as one user message)."""
    chat = body.get("messages") if isinstance(body, dict) else None
    if not (
        isinstance(chat, list)
        and len(chat) == 2
        and [m.get("role") if isinstance(m, dict) else None for m in chat] == ["system", "user"]
        and all(isinstance(m.get("content"), str) for m in chat)
    ):
        raise ValueError("expected a system message and one user message holding the transcript")
    return json.dumps(memories(chat[1]["content"]))


@dataclass
class Standin:
    """A running stand-in: its base URL (ending with ``/v1``) and the requests it received."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: Standin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with state.lock:
                    state.requests.append(body)
                if self.path != "/v1/chat/completions":
                    return self._send(404, _error("Not found"))
                text = answer(body)
            except ValueError as exc:  # JSON that is not a request of the extractor's
                return self._send(400, _error(str(exc)))
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
            completion = {
                "id": f"chatcmpl-standin-{len(state.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", ""),
                "choices": [choice],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
            self._send(200, completion)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


@contextmanager
def standin(port: int = 0) -> Iterator[Standin]:
    """The stand-in serving on loopback (``port`` 0: a free one) until the block ends."""
    state = Standin()
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="llm-standin", daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    with standin(args.port) as state:
        print(f"Serving {state.url} (Ctrl-C stops it)", flush=True)
        with suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
