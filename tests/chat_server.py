"""A small local server that speaks OpenAI's chat-completions protocol, standing in for a
model provider (no model is reachable from the test machines): ``POST
/v1/chat/completions`` answers a ``ChatCompletion`` JSON, or what the test scripted
(a delay, an HTTP error, an empty answer). Everything talking to it is the real client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: A reply delay no client timeout in the tests waits for: a timeout test fails by its
#: timeout, never because a loaded machine took longer than a short delay.
HANG = 60.0


@dataclass
class Reply:
    """What the server answers to one request."""

    content: str | None = "A summary."
    status: int = 200
    delay: float = 0.0
    #: Answer a completion without choices.
    no_choices: bool = False


@dataclass
class ChatServer:
    """The server's script (replies in order; the last one repeats) and what it received."""

    url: str = ""
    replies: list[Reply] = field(default_factory=lambda: [Reply()])
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_reply(self) -> Reply:
        with self.lock:
            return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


def completion(model: str, reply: Reply) -> dict[str, Any]:
    """A ChatCompletion object, as OpenAI's API answers one."""
    choices = [
        {
            "index": 0,
            "message": {"role": "assistant", "content": reply.content, "refusal": None},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    return {
        "id": "chatcmpl-local-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [] if reply.no_choices else choices,
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }


class JSONHandler(BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler reading and answering JSON (the stand-in servers' base)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def read_recorded(self, requests: list[dict[str, Any]], lock: threading.Lock) -> Any:
        """The request's JSON body, recorded in ``requests`` with its path and headers."""
        body = self.read_json()
        with lock:
            headers = {name.lower(): value for name, value in self.headers.items()}
            requests.append({"path": self.path, "headers": headers, "body": body})
        return body

    def send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], name: str) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port; yields the base URL (ending with ``/v1``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _handler(state: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(JSONHandler):
        def do_POST(self) -> None:
            body = self.read_recorded(state.requests, state.lock)
            reply = state.next_reply()
            if reply.delay:
                time.sleep(reply.delay)
            if self.path != "/v1/chat/completions":
                self.send_json(404, {"error": {"message": "Not found", "type": "invalid_request_error"}})
            elif reply.status != 200:
                error = {"message": f"Scripted error {reply.status}", "type": "server_error", "code": None}
                self.send_json(reply.status, {"error": error})
            else:
                self.send_json(200, completion(body.get("model", ""), reply))

    return Handler


@contextmanager
def chat_server() -> Iterator[ChatServer]:
    """A running server on a free loopback port; ``url`` ends with ``/v1``."""
    state = ChatServer()
    with serving(_handler(state), "chat-server") as state.url:
        yield state
