"""The admin's conversations: each one as a chat transcript on its session's page, a page
per conversation with every thread (``?leaf=<message id>`` shows the thread ending
there), and a read-only list of messages searchable by content.

Like the rest of the admin, it reads the mirror rows only (see
:mod:`persistent_memory.admin.transcript`); opening a conversation first syncs the sessions
written since the last sync.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import Truncator

from persistent_memory.admin.base import ReadOnlyMixin, pretty_json
from persistent_memory.admin.transcript import SESSION_PAGE_MESSAGES, UnknownLeaf, build
from persistent_memory.chat.messages import ROLES
from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.models import MemoryConversation, MemoryMessage, MemorySession
from persistent_memory.store import get_store


def _sync(model_admin: admin.ModelAdmin, request: HttpRequest) -> None:
    """Sync what was written since the last sync, as the sessions' pages do."""
    store = get_store()
    if not store.mirror.enabled:
        return
    try:
        store.mirror.sync_dirty(limit=memory_settings.ADMIN_SYNC_LIMIT)
    except PersistentMemoryError as exc:
        model_admin.message_user(request, f"Showing the mirror as last synced: {exc}", messages.WARNING)


def conversation_url(conversation_pk: int, leaf: str | None = None) -> str:
    """The conversation's page, showing the thread that ends at ``leaf`` (None: the head)."""
    url = reverse("admin:persistent_memory_memoryconversation_change", args=[conversation_pk])
    return f"{url}?{urlencode({'leaf': leaf})}" if leaf else url


def messages_url(**filters: Any) -> str:
    return f"{reverse('admin:persistent_memory_memorymessage_changelist')}?{urlencode(filters)}"


class ConversationInline(ReadOnlyMixin, admin.StackedInline):
    """The session page's conversations, each as the transcript of its current thread."""

    model = MemoryConversation
    fields = ()
    extra = 0
    template = "admin/persistent_memory/edit_inline/conversations.html"
    verbose_name_plural = "conversations"
    #: Messages of each thread shown here (the conversation's page has them all).
    messages_shown = SESSION_PAGE_MESSAGES

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A session without conversations gets no section at all (not an empty one).
        if isinstance(obj, MemorySession) and not obj.conversations.exists():
            return False
        return super().has_view_permission(request, obj)


# The conversations' own pages ----------------------------------------------------------


@admin.register(MemoryConversation)
class MemoryConversationAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("name", "session_link", "message_count", "tokens", "branch_count", "trimmed", "head")
    search_fields = ("^name", "^session__session_id", "^session__owner")
    list_select_related = ("session",)
    ordering = ("session", "name")
    list_per_page = 100
    show_full_result_count = False
    actions = None  # read-only: no checkboxes, no "delete selected"
    fields = ("session", "name", "head", "seq", "message_count", "tokens", "branch_count", "trimmed")
    readonly_fields = fields
    change_form_template = "admin/persistent_memory/memoryconversation/change_form.html"

    @admin.display(description="session", ordering="session__session_id")
    def session_link(self, obj: MemoryConversation) -> str:
        url = reverse("admin:persistent_memory_memorysession_change", args=[obj.session_id])
        return format_html('<a href="{}">{}</a>', url, obj.session)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        _sync(self, request)
        conversation = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if conversation is not None:
            leaf = request.GET.get("leaf") or None
            try:
                context["transcript"] = build(conversation, leaf=leaf)
            except UnknownLeaf:
                self.message_user(
                    request,
                    f"This conversation has no message {leaf!r}; showing its current thread.",
                    messages.WARNING,
                )
                context["transcript"] = build(conversation)
            context["messages_url"] = messages_url(conversation=conversation.pk)
        return super().change_view(request, object_id, form_url, context)


# Messages ------------------------------------------------------------------------------


class RoleFilter(admin.SimpleListFilter):
    title = "role"
    parameter_name = "role"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(role, role) for role in ROLES]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(role=self.value()) if self.value() in ROLES else queryset


class ConversationFilter(admin.SimpleListFilter):
    """One conversation's messages: the 20 conversations with most messages are offered,
    and any other works as ``?conversation=<its id>`` (its page links there)."""

    title = "conversation"
    parameter_name = "conversation"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        top = MemoryConversation.objects.select_related("session").order_by("-message_count", "pk")[:20]
        offered = [(str(c.pk), f"{c.session} · {c.name}") for c in top]
        value = self.value()
        if value and value.isdigit() and value not in {pk for pk, _ in offered}:
            chosen = MemoryConversation.objects.select_related("session").filter(pk=value).first()
            if chosen is not None:
                offered.insert(0, (value, f"{chosen.session} · {chosen.name}"))
        return offered

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(conversation_id=int(value)) if value.isdigit() else queryset.none()


class SessionFilter(admin.SimpleListFilter):
    """One session's messages (``?session=<its row id>``): linked from its page, not listed."""

    title = "session"
    parameter_name = "session"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        if value and value.isdigit():
            session = MemorySession.objects.filter(pk=value).first()
            if session is not None:
                return [(value, str(session))]
        return []

    def has_output(self) -> bool:
        return bool(self.lookup_choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(conversation__session_id=int(value)) if value.isdigit() else queryset.none()


def role_badge(role: str) -> str:
    return format_html('<span class="pm-role pm-role-{}">{}</span>', role, role)


@admin.register(MemoryMessage)
class MemoryMessageAdmin(ReadOnlyMixin, admin.ModelAdmin):
    actions = None  # read-only: no checkboxes, no "delete selected"
    list_display = (
        "created_at",
        "role_display",
        "content_preview",
        "conversation_link",
        "session_link",
        "tokens",
    )
    list_filter = (RoleFilter, ConversationFilter, SessionFilter)
    search_fields = ("content_text",)
    list_select_related = ("conversation__session",)
    ordering = ("-created_at", "-pk")
    date_hierarchy = "created_at"
    list_per_page = 100
    show_full_result_count = False
    fields = (
        "conversation_link",
        "message_id",
        "parent_id",
        "seq",
        "role_display",
        "name",
        "tool_call_id",
        "content",
        "tool_calls_display",
        "metadata_display",
        "tokens",
        "tokenizer",
        "created_at",
        "stored_display",
    )
    readonly_fields = fields
    change_list_template = "admin/persistent_memory/memorymessage/change_list.html"

    @admin.display(description="role", ordering="role")
    def role_display(self, obj: MemoryMessage) -> str:
        return role_badge(obj.role)

    @admin.display(description="content")
    def content_preview(self, obj: MemoryMessage) -> str:
        text = " ".join(obj.content_text.split())
        if not text and obj.tool_calls:
            text = "calls " + ", ".join(f"{c['function']['name']}()" for c in obj.tool_calls)
        return Truncator(text).chars(120)

    @admin.display(description="content")
    def content(self, obj: MemoryMessage) -> str:
        return format_html('<div class="pm-text">{}</div>', obj.content_text)

    @admin.display(description="conversation", ordering="conversation__name")
    def conversation_link(self, obj: MemoryMessage) -> str:
        url = conversation_url(obj.conversation_id, obj.message_id) + f"#message-{obj.message_id}"
        return format_html('<a href="{}">{}</a>', url, obj.conversation.name)

    @admin.display(description="session", ordering="conversation__session__session_id")
    def session_link(self, obj: MemoryMessage) -> str:
        url = reverse("admin:persistent_memory_memorysession_change", args=[obj.conversation.session_id])
        return format_html('<a href="{}">{}</a>', url, obj.conversation.session)

    @admin.display(description="tool calls")
    def tool_calls_display(self, obj: MemoryMessage) -> str:
        return self._json(obj.tool_calls)

    @admin.display(description="metadata")
    def metadata_display(self, obj: MemoryMessage) -> str:
        return self._json(obj.metadata)

    @admin.display(description="stored JSON")
    def stored_display(self, obj: MemoryMessage) -> str:
        return format_html("<pre style='margin:0'>{}</pre>", pretty_json(obj.stored))

    @staticmethod
    def _json(value: Any) -> str:
        if value is None:
            return "—"
        return format_html("<pre style='margin:0'>{}</pre>", pretty_json(json.dumps(value)))

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        _sync(self, request)
        return super().changelist_view(request, extra_context)
