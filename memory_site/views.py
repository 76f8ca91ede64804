"""The demo site's landing page: what this is, what to try, and what the store holds."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from persistent_memory import get_store
from persistent_memory.errors.reporting import caller_detail
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.health import backend_health
from persistent_memory.owners.resolvers import resolve_owner

#: The README's commands (step 5 of "Add it to your project" and "REST API").
CREATE_USER = (
    "DJANGO_SUPERUSER_PASSWORD=change-me python manage.py createsuperuser --noinput "
    "--username admin --email admin@example.com"
)
CREATE_TOKEN = "TOKEN=$(python manage.py drf_create_token admin | awk '{print $3}')"  # noqa: S105 - a command
#: How many of a signed-in user's newest sessions the page lists.
NEWEST_SESSIONS = 10


def own_sessions(request: HttpRequest) -> dict[str, Any] | None:
    """A signed-in user's own sessions: how many, and the newest few with their keys and
    history; None for a visitor who is not signed in (nothing of anyone's is shown).

    One backend call for a page of one owner, whatever the number of sessions stored:
    the page is public, so what it costs must not grow with the store.
    """
    if not request.user.is_authenticated:
        return None
    owner = resolve_owner(request)
    if owner is None:
        return None
    total, newest = get_store().for_owner(owner).list_session_page(limit=NEWEST_SESSIONS)
    return {"owner": owner, "sessions": total, "newest": newest}


def home(request: HttpRequest) -> HttpResponse:
    """The backend serving the demo and whether it answers, the signed-in user's own
    sessions, and what to try. Where the backend is (an address) is shown to staff only."""
    store = get_store()
    backend = backend_health(store)
    staff = request.user.is_staff
    if not staff:  # where the backend is, and what its errors say, are the operator's
        backend = {key: value for key, value in backend.items() if key in ("name", "status", "latency_ms")}
    context: dict[str, Any] = {
        "backend": backend,
        "mirror_mode": store.mirror.mode,
        "mine": None,
        "error": None,
        "create_user": CREATE_USER,
        "create_token": CREATE_TOKEN,
        "enrich_url": request.build_absolute_uri("/api/memory/enrich/"),
    }
    try:
        context["mine"] = own_sessions(request)
    except PersistentMemoryError as exc:  # the backend down, an owner the resolver refuses, ...
        context["error"] = str(exc) if staff else caller_detail(exc)
    return render(request, "home.html", context)
