"""Page number pagination of the session listing, one store call per page.

DRF's ``PageNumberPagination`` pages a list it holds whole; the listing instead asks
the store for one page and the count (``MemoryStore.list_session_page``), and hands
Django's paginator a stand-in that has just that count and that page. Everything
else (``page``, ``page_size``, ``last``, the 404 for a page out of range, and the
``count``/``next``/``previous``/``results`` body) is DRF's own.
"""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

from persistent_memory.backends.base import SessionInfo
from persistent_memory.store import MemoryStore

# Past any real listing, and still a valid offset for the store.
_FURTHEST_OFFSET = 2**62


class _FetchedPage:
    """What Django's ``Paginator`` reads of a list: its count and the slice of one page,
    here the page the store returned from ``offset``."""

    def __init__(self, total: int, offset: int, infos: list[SessionInfo]) -> None:
        self.total, self.offset, self.infos = total, offset, infos

    def count(self) -> int:
        return self.total

    def __getitem__(self, window: slice) -> list[SessionInfo]:
        start = max(0, window.start - self.offset)
        return self.infos[start : start + window.stop - window.start]


class SessionPagination(PageNumberPagination):
    """``?page=&page_size=`` over the caller's sessions, newest first."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def paginate_sessions(self, store: MemoryStore, search: str, request: Request, view: Any = None) -> list:
        """The sessions of the page ``request`` asks for (``NotFound`` past the last page)."""
        page_size = self.get_page_size(request) or self.page_size
        number = request.query_params.get(self.page_query_param) or 1
        if number in self.last_page_strings:  # which page that is needs the count first
            total, _ = store.list_session_page(search, limit=0)
            number = max(1, -(-total // page_size))
        try:
            offset = min(max(0, (int(number) - 1) * page_size), _FURTHEST_OFFSET)
        except ValueError:
            offset = 0  # not a page number: the paginator answers 404 below
        total, infos = store.list_session_page(search, offset=offset, limit=page_size)
        return self.paginate_queryset(_FetchedPage(total, offset, infos), request, view) or []
