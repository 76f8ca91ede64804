"""The demo site's landing page."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from persistent_memory import get_store
from persistent_memory.exceptions import BackendUnavailable


def home(request: HttpRequest) -> HttpResponse:
    """Which backend serves the demo, whether it answers, and how many sessions it holds."""
    store = get_store()
    context = {"backend": store.backend.describe(), "sessions": None, "error": None}
    try:
        context["sessions"] = len(store.list_sessions())
    except BackendUnavailable as exc:
        context["error"] = str(exc)
    return render(request, "home.html", context)
