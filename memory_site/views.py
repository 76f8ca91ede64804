"""The demo site's landing page: what this is, what to try, and what the store holds."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from persistent_memory import get_store
from persistent_memory.exceptions import BackendUnavailable
from persistent_memory.health import backend_health

#: The README's commands (step 5 of "Add it to your project" and "REST API").
CREATE_USER = (
    "DJANGO_SUPERUSER_PASSWORD=change-me python manage.py createsuperuser --noinput "
    "--username admin --email admin@example.com"
)
CREATE_TOKEN = "TOKEN=$(python manage.py drf_create_token admin | awk '{print $3}')"  # noqa: S105 - a command


def store_counts() -> dict[str, int]:
    """Live sessions of every owner, how many owners hold them, their keys and history entries."""
    infos = get_store().list_session_infos(all_owners=True)
    return {
        "sessions": len(infos),
        "owners": len({info["owner"] for info in infos}),
        "keys": sum(info["key_count"] for info in infos),
        "history": sum(info["history_length"] for info in infos),
    }


def home(request: HttpRequest) -> HttpResponse:
    """The backend serving the demo, whether it answers, what it holds, and what to try."""
    store = get_store()
    context: dict[str, Any] = {
        "backend": backend_health(store),
        "mirror_mode": store.mirror.mode,
        "counts": None,
        "error": None,
        "create_user": CREATE_USER,
        "create_token": CREATE_TOKEN,
        "enrich_url": request.build_absolute_uri("/api/memory/enrich/"),
    }
    try:
        context["counts"] = store_counts()
    except BackendUnavailable as exc:
        context["error"] = str(exc)
    return render(request, "home.html", context)
