"""Pagination of the session listing, one store call per page.

DRF's ``PageNumberPagination`` pages a list it holds whole; the listing instead asks
the store for one page and the count (``MemoryStore.session_page``), and hands
Django's paginator a stand-in that has just that count and that page. ``page``,
``page_size``, ``last``, the 404 for a page out of range and the
``count``/``next``/``previous``/``results`` body are DRF's own; ``next`` is a cursor
link, as with DRF's ``CursorPagination``: ``?cursor=`` reads on after the page before,
and any page it reaches costs what the first one costs. A page number reaches at most
``MAX_PAGE_OFFSET`` sessions in (400 ``page_too_deep`` beyond); a cursor that this
owner's listing (and search) did not give is a 400 ``invalid_cursor``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from persistent_memory.backends.base import SessionInfo
from persistent_memory.store import MAX_PAGE_OFFSET, MemoryStore, SessionPage

# Past any page a number may ask for: the store then answers page_too_deep.
_FURTHEST_OFFSET = MAX_PAGE_OFFSET + 1


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
    """``?page=&page_size=`` or ``?cursor=&page_size=`` over the caller's sessions, newest first."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    cursor_query_param = "cursor"

    fetched: SessionPage | None = None
    by_cursor = False

    def paginate_sessions(self, store: MemoryStore, search: str, request: Request, view: Any = None) -> list:
        """The sessions of the page ``request`` asks for (``NotFound`` past the last page)."""
        self.request = request
        page_size = self.get_page_size(request) or self.page_size
        cursor = request.query_params.get(self.cursor_query_param)
        if cursor is not None:  # the page number, if any, is the cursor's page's business
            self.by_cursor = True
            self.fetched = store.session_page(search, cursor=cursor, limit=page_size)
            return self.fetched.sessions
        number = request.query_params.get(self.page_query_param) or 1
        if number in self.last_page_strings:  # which page that is needs the count first
            total, _ = store.list_session_page(search, limit=0)
            number = max(1, -(-total // page_size))
        try:
            offset = max(0, (int(number) - 1) * page_size)
        except ValueError:
            offset = 0  # not a page number: the paginator answers 404 below
        if offset > MAX_PAGE_OFFSET:
            total, _ = store.list_session_page(search, limit=0)
            if offset >= total:  # past the last page, however short the listing: DRF's 404
                return self.paginate_queryset(_FetchedPage(total, offset, []), request, view) or []
            offset = _FURTHEST_OFFSET  # the store answers page_too_deep
        self.fetched = store.session_page(search, offset=offset, limit=page_size)
        page = _FetchedPage(self.fetched.total, offset, self.fetched.sessions)
        return self.paginate_queryset(page, request, view) or []

    def get_next_link(self) -> str | None:
        if self.fetched is None or self.fetched.next_cursor is None:
            return None
        url = remove_query_param(self.request.build_absolute_uri(), self.page_query_param)
        return replace_query_param(url, self.cursor_query_param, self.fetched.next_cursor)

    def get_previous_link(self) -> str | None:
        # A cursor reads forward only (the first page is the listing without one).
        return None if self.by_cursor else super().get_previous_link()

    def get_paginated_response(self, data: Any) -> Response:
        if not self.by_cursor:
            return super().get_paginated_response(data)
        assert self.fetched is not None  # noqa: S101 - set by paginate_sessions
        return Response(
            {"count": self.fetched.total, "next": self.get_next_link(), "previous": None, "results": data}
        )
