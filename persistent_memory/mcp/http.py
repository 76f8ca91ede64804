"""Streamable HTTP for the MCP servers, beside a Django ASGI application.

:func:`with_mcp` wraps the project's ASGI application: requests under ``path`` (``/mcp/``)
are authenticated with the REST API's tokens (``Authorization: Token <key>``, DRF's
``TokenAuthentication``), their owner is resolved by ``OWNER_RESOLVER`` exactly as for
the API, and the request goes to that owner's own server (built once per owner by
:func:`~persistent_memory.mcp.server.build_server`); everything else goes to Django.

The servers run stateless (every POST stands alone, answered as JSON): no MCP session
lives in one process, so a request can reach any worker, and a session id of one owner
cannot be replayed with another owner's token. Each owner's session manager runs in a
task group of the ASGI lifespan, which the server (uvicorn) must run.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from asgiref.sync import sync_to_async
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from mcp.server.transport_security import TransportSecuritySettings

from persistent_memory.exceptions import InvalidOwner
from persistent_memory.mcp.server import build_server

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

    from persistent_memory.resolvers import resolve_owner

    close_old_connections()
    try:
        request = ASGIRequest(scope, io.BytesIO())
        try:
            # Django's own Host check (ALLOWED_HOSTS), as for every other page of the site;
            # it stands in for the SDK's DNS rebinding protection.
            request.get_host()
        except DisallowedHost as exc:
            raise Refused(400, "disallowed_host", str(exc)) from exc
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


async def _refuse(send: Send, refused: Refused) -> None:
    body = json.dumps({"detail": refused.detail, "code": refused.code}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refused.status == 401:
        headers.append((b"www-authenticate", b"Token"))
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class MCPEndpoint:
    """The ``/mcp/`` endpoint: token authentication, then the token owner's MCP server."""

    def __init__(self, path: str = "/mcp/") -> None:
        self.path = path
        self._apps: dict[str, ASGIApp] = {}
        self._lock = anyio.Lock()
        self._task_group: TaskGroup | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve while the block runs (the ASGI lifespan): the owners' session managers live here."""
        async with anyio.create_task_group() as task_group:
            self._task_group = task_group
            try:
                yield
            finally:
                task_group.cancel_scope.cancel()
                self._task_group = None
                self._apps.clear()

    async def _app_for(self, owner: str) -> ASGIApp:
        async with self._lock:
            app = self._apps.get(owner)
            if app is None:
                app = await self._start(owner)
                self._apps[owner] = app
            return app

    async def _start(self, owner: str) -> ASGIApp:
        if self._task_group is None:
            raise Refused(
                503, "mcp_not_running", "The MCP endpoint needs an ASGI server that runs the lifespan."
            )
        server = build_server(owner)
        app = server.streamable_http_app(
            streamable_http_path=self.path,
            stateless_http=True,
            json_response=True,
            # The Host header was checked against ALLOWED_HOSTS already.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        manager = server.session_manager

        async def run(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with manager.run():
                task_status.started()
                await anyio.sleep_forever()

        await self._task_group.start(run)
        return app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            owner = await sync_to_async(_authenticate)(scope)
            app = await self._app_for(owner)
        except Refused as refused:
            await _refuse(send, refused)
            return
        # The SDK's app routes its one path: both spellings of ours reach it.
        await app({**scope, "path": self.path, "raw_path": self.path.encode()}, receive, send)


def with_mcp(application: ASGIApp, *, path: str = "/mcp/") -> ASGIApp:
    """``application`` (Django's ASGI handler) with the MCP endpoint at ``path`` (and at it
    without the trailing slash), and the ASGI lifespan that endpoint needs."""
    endpoint = MCPEndpoint(path)
    bare = path.rstrip("/")

    async def lifespan(receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"  # noqa: S101 - the ASGI protocol's order
        async with endpoint.running():
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

    return router
