"""A small local server that speaks OpenAI's Responses API, standing in for a model
provider (no model is reachable from the test machines): ``POST /v1/responses`` answers
a ``Response`` JSON whose output items the test scripted. Everything talking to it is the
real client: the ``openai`` package, or the Agents SDK's ``OpenAIResponsesModel``.

Only non-streaming requests are answered: ``agents.Runner.run`` asks with
``stream=False``; a ``stream=True`` request (``Runner.run_streamed``) gets a 400, so a
test that needs streaming fails loudly rather than hanging."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.chat_server import JSONHandler, serving

#: One turn's output items (messages, function calls, reasoning), as the API lists them.
Output = list[dict[str, Any]]
#: A scripted turn: its output items, or a function of the request body returning them.
Reply = Output | Callable[[dict[str, Any]], Output]

_ids = itertools.count(1)


def _id(prefix: str) -> str:
    # Unique across servers too: the Agents SDK sends items back by id.
    return f"{prefix}_local{next(_ids):06d}"


def text(content: str) -> dict[str, Any]:
    """An assistant message output item."""
    part = {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": _id("msg"),
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


def call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """A function-call output item; ``arguments`` a dict or the JSON string the API sends."""
    return {
        "type": "function_call",
        "id": _id("fc"),
        "call_id": call_id or _id("call"),
        "name": name,
        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        "status": "completed",
    }


def reasoning(summary: str) -> dict[str, Any]:
    """A reasoning output item with one summary text."""
    return {"type": "reasoning", "id": _id("rs"), "summary": [{"type": "summary_text", "text": summary}]}


@dataclass
class ResponsesServer:
    """The server's script (replies consumed in order, then "Done.") and the request
    bodies it received."""

    url: str = ""
    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_output(self, body: dict[str, Any]) -> Output:
        with self.lock:
            reply = self.replies.pop(0) if self.replies else None
        if reply is None:
            return [text("Done.")]
        return reply(body) if callable(reply) else reply


def response(body: dict[str, Any], output: Output) -> dict[str, Any]:
    """A Response object, as OpenAI's API answers one (request settings echoed back)."""
    return {
        "id": _id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model", ""),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": 12,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 17,
        },
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def _handler(state: ResponsesServer) -> type[BaseHTTPRequestHandler]:
    class Handler(JSONHandler):
        def do_POST(self) -> None:
            body = self.read_json()
            if self.path != "/v1/responses":
                self._error(404, "Not found")
                return
            with state.lock:
                state.requests.append(body)
            if body.get("stream"):
                self._error(400, "The local Responses server does not stream")
            else:
                self.send_json(200, response(body, state.next_output(body)))

        def _error(self, status: int, message: str) -> None:
            self.send_json(
                status, {"error": {"message": message, "type": "invalid_request_error", "code": None}}
            )

    return Handler


@contextmanager
def responses_server(*replies: Reply) -> Iterator[ResponsesServer]:
    """A running server on a free loopback port answering ``replies`` in order (or set
    ``.replies`` later); ``url`` ends with ``/v1``."""
    state = ResponsesServer(replies=list(replies))
    with serving(_handler(state), "responses-server") as state.url:
        yield state
