"""Streamable HTTP for the MCP servers, beside a Django ASGI application.

:func:`with_mcp` wraps the project's ASGI application: requests under ``path`` (``/mcp/``)
are authenticated with the REST API's tokens (``Authorization: Token <key>``, DRF's
``TokenAuthentication``), their owner is resolved by ``OWNER_RESOLVER`` exactly as for
the API, and the request goes to that owner's own server (built on the owner's first
request by :func:`~persistent_memory.mcp.server.build_server`, kept for the next ones
within ``MCP_MAX_SERVERS`` and ``MCP_SERVER_IDLE_SECONDS``); everything else goes to
Django.

The servers run stateless (every POST stands alone, answered as JSON): no MCP session
lives in one process, so a request can reach any worker, and a session id of one owner
cannot be replayed with another owner's token. Each owner's session manager runs in a
task group of the ASGI lifespan, which the server (uvicorn) must run.

Every error answer is JSON: the endpoint's own (``{"detail", "code"}``), the SDK's
JSON-RPC errors, and the few the SDK answers as plain text (a body over
``MAX_REQUEST_BYTES``: 413 ``payload_too_large``; a POST that is not JSON: 400), which
the endpoint rewrites as the endpoint's own.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from asgiref.sync import sync_to_async
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from mcp.server.transport_security import TransportSecuritySettings

from persistent_memory.api.errors import (
    DATABASE_UNAVAILABLE,
    DatabaseUnavailable,
    DisallowedHostError,
    ServerError,
    error_answer,
)
from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import InvalidOwner
from persistent_memory.mcp.server import build_server

logger = logging.getLogger("persistent_memory.mcp")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


OWNER_REQUIRED = "No owner could be resolved for this request, so it can reach no memory."
NOT_RUNNING = "The MCP endpoint needs an ASGI server that runs the lifespan (uvicorn does)."


class Refused(Exception):
    """A request the endpoint answers itself with an error (status, code, detail)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def _authenticate(scope: Scope) -> str:
    """The owner of a request's token (run in Django's sync thread), or :class:`Refused`."""
    from rest_framework.authentication import TokenAuthentication
    from rest_framework.exceptions import AuthenticationFailed

    from persistent_memory.owners.resolvers import resolve_owner

    close_old_connections()
    try:
        request = ASGIRequest(scope, io.BytesIO())
        try:
            # Django's own Host check (ALLOWED_HOSTS), as for every other page of the site;
            # it stands in for the SDK's DNS rebinding protection.
            request.get_host()
        except DisallowedHost as exc:  # the API's answer: Django's message is for the operator
            raise Refused(400, "disallowed_host", DisallowedHostError.default_detail) from exc
        try:
            authenticated = TokenAuthentication().authenticate(request)
        except AuthenticationFailed as exc:
            raise Refused(401, "authentication_failed", str(exc.detail)) from exc
        if authenticated is None:
            raise Refused(401, "not_authenticated", "Authentication credentials were not provided.")
        request.user, request.auth = authenticated
        try:
            owner = resolve_owner(request)
        except InvalidOwner as exc:
            raise Refused(403, exc.code, str(exc)) from exc
        if owner is None:
            raise Refused(
                403,
                "owner_required",
                "No owner could be resolved for this request, so it can reach no memory.",
            )
        return owner
    finally:
        close_old_connections()


#: Codes of the SDK's plain-text error answers, by status (others: the status's phrase).
PLAIN_ERROR_CODES = {400: "bad_request", 413: "payload_too_large"}


def _json_errors(send: Send) -> Send:
    """``send`` with the SDK's plain-text error answers (its 413 "Request body too large",
    its 400 for a Content-Type) turned into ``{"detail", "code"}`` JSON; every other
    message passes through as it is."""
    held: MutableMapping[str, Any] | None = None  # an error's response start, until its body
    body = b""

    async def send_json_errors(message: MutableMapping[str, Any]) -> None:
        nonlocal held, body
        if message["type"] == "http.response.start" and message["status"] >= 400:
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            if not content_type.startswith(b"application/json"):
                held = message
                return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        body += message.get("body", b"")
        if message.get("more_body", False):
            return
        status = held["status"]
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:  # a status Python does not name
            phrase = "Error"
        code = PLAIN_ERROR_CODES.get(status) or phrase.lower().replace(" ", "_").replace("-", "_")
        detail = body.decode(errors="replace").strip() or phrase
        if status == 413:
            detail = "The request body is too large."
        await _refuse(send, Refused(status, code, detail))
        held = None

    return send_json_errors


async def _refuse(send: Send, refused: Refused) -> None:
    await _send_json(send, refused.status, {"detail": refused.detail, "code": refused.code})


async def _send_json(
    send: Send, status: int, content: dict[str, Any], extra: dict[str, str] | None = None
) -> None:
    body = json.dumps(content).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Token"))
    headers += [(name.lower().encode(), value.encode()) for name, value in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass(eq=False)
class OwnerServer:
    """One owner's MCP server as the endpoint runs it: the SDK's ASGI app, whether its
    session manager should stop and has stopped, and the requests it is answering."""

    owner: str
    app: ASGIApp
    last_used: float
    in_flight: int = 0
    evicted: bool = False
    stop: anyio.Event = field(default_factory=anyio.Event)
    stopped: anyio.Event = field(default_factory=anyio.Event)


class MCPEndpoint:
    """The ``/mcp/`` endpoint: token authentication, then the token owner's MCP server.

    Owners' servers are built on their first request and kept for the next ones, at most
    ``MCP_MAX_SERVERS`` of them: a new owner beyond that evicts the least recently used
    one, and a server unused for ``MCP_SERVER_IDLE_SECONDS`` is evicted too. An evicted
    server's session manager stops cleanly once the requests it is answering are done;
    the owner's next request builds a new one (the servers are stateless, so nothing of
    the owner's is lost).
    """

    #: How often (seconds) idle servers are looked for, at most.
    reap_every: float = 60.0

    def __init__(self, path: str = "/mcp/", *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        # Least recently used first.
        self._servers: OrderedDict[str, OwnerServer] = OrderedDict()
        # Servers whose session manager runs: the kept ones, and evicted ones finishing requests.
        self._running: set[OwnerServer] = set()
        self._lock = anyio.Lock()
        self._task_group: TaskGroup | None = None

    @property
    def owners(self) -> list[str]:
        """The owners whose servers are kept, least recently used first."""
        return list(self._servers)

    @property
    def running(self) -> int:
        """Session managers running: the kept servers', and evicted ones' still answering."""
        return len(self._running)

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[None]:
        """Serve while the block runs (the ASGI lifespan): the owners' session managers live here."""
        async with anyio.create_task_group() as task_group:
            self._task_group = task_group
            task_group.start_soon(self._reap)
            try:
                yield
            finally:
                task_group.cancel_scope.cancel()
                self._task_group = None
                self._servers.clear()

    @asynccontextmanager
    async def serving(self, owner: str) -> AsyncIterator[OwnerServer]:
        """``owner``'s server (started if need be) for one request; it is not stopped while
        the block runs, even if evicted meanwhile."""
        server = await self._acquire(owner)
        try:
            yield server
        finally:
            server.in_flight -= 1
            server.last_used = self.clock()
            if server.evicted and server.in_flight == 0:
                server.stop.set()

    async def _acquire(self, owner: str) -> OwnerServer:
        if self._task_group is None:
            raise Refused(503, "mcp_not_running", NOT_RUNNING)
        async with self._lock:
            server = self._servers.get(owner)
            if server is None:
                bound = memory_settings.MCP_MAX_SERVERS
                while len(self._servers) >= bound:
                    await self._evict(next(iter(self._servers.values())), "least recently used")
                server = await self._start(owner)
                self._servers[owner] = server
            else:
                self._servers.move_to_end(owner)
            server.in_flight += 1
            server.last_used = self.clock()
            return server

    async def _evict(self, server: OwnerServer, why: str) -> None:
        """Forget ``server``; its session manager stops now, or when its last request ends."""
        del self._servers[server.owner]
        server.evicted = True
        logger.debug("persistent_memory: MCP server of %s evicted (%s)", server.owner, why)
        if server.in_flight == 0:
            server.stop.set()
            # Stopped before another starts: at most MCP_MAX_SERVERS run while none is busy.
            await server.stopped.wait()

    async def evict_idle(self) -> int:
        """Evict the servers unused for ``MCP_SERVER_IDLE_SECONDS``; how many."""
        idle = memory_settings.MCP_SERVER_IDLE_SECONDS
        if not idle:
            return 0
        async with self._lock:
            now = self.clock()
            gone = [s for s in self._servers.values() if s.in_flight == 0 and now - s.last_used >= idle]
            for server in gone:
                await self._evict(server, f"idle for {now - server.last_used:.0f} s")
            return len(gone)

    async def _reap(self) -> None:
        while True:
            idle = memory_settings.MCP_SERVER_IDLE_SECONDS
            await anyio.sleep(min(self.reap_every, idle or self.reap_every))
            await self.evict_idle()

    async def _start(self, owner: str) -> OwnerServer:
        assert self._task_group is not None  # noqa: S101 - _acquire checked it
        mcp_server = build_server(owner)
        app = mcp_server.streamable_http_app(
            streamable_http_path=self.path,
            # The API's limit, answered as JSON 413 (see _json_errors).
            max_request_body_size=memory_settings.MAX_REQUEST_BYTES,
            stateless_http=True,
            json_response=True,
            # The Host header was checked against ALLOWED_HOSTS already.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        manager = mcp_server.session_manager
        server = OwnerServer(owner, app, last_used=self.clock())

        async def run(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            try:
                async with manager.run():
                    self._running.add(server)
                    logger.debug(
                        "persistent_memory: MCP server of %s started (%d running)", owner, len(self._running)
                    )
                    task_status.started()
                    await server.stop.wait()
            finally:
                self._running.discard(server)
                server.stopped.set()
                running = len(self._running)
                logger.debug("persistent_memory: MCP server of %s stopped (%d running)", owner, running)

        await self._task_group.start(run)
        return server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            owner = await sync_to_async(_authenticate)(scope)
            async with self.serving(owner) as server:
                # The SDK's app routes its one path: both spellings of ours reach it.
                scope = {**scope, "path": self.path, "raw_path": self.path.encode()}
                await server.app(scope, receive, _json_errors(tracked))
        except Refused as refused:  # raised before the app is called: nothing was sent yet
            await _refuse(send, refused)
        except Exception as exc:
            # The database down while the token is read, or anything else nothing handled:
            # JSON with a code and a request id (the details go to the log), as the API
            # answers, never the ASGI server's plain-text 500.
            if started:  # an answer is under way: all that is left is to end the connection
                raise
            error = DatabaseUnavailable() if isinstance(exc, DATABASE_UNAVAILABLE) else ServerError()
            body, headers = error_answer(error, exc, method=scope.get("method", "?"), path=self.path)
            await _send_json(send, error.status_code, body, headers)


def with_mcp(application: ASGIApp, *, path: str = "/mcp/") -> ASGIApp:
    """``application`` (Django's ASGI handler) with the MCP endpoint at ``path`` (and at it
    without the trailing slash), and the ASGI lifespan that endpoint needs."""
    endpoint = MCPEndpoint(path)
    bare = path.rstrip("/")

    async def lifespan(receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"  # noqa: S101 - the ASGI protocol's order
        async with endpoint.serve():
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
        await send({"type": "lifespan.shutdown.complete"})

    async def router(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        elif scope["type"] == "http" and scope["path"] in (path, bare):
            await endpoint(scope, receive, send)
        else:
            await application(scope, receive, send)

    router.endpoint = endpoint  # type: ignore[attr-defined] - for a look at its servers
    return router
