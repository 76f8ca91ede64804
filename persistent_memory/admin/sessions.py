"""The admin: a read-only view of the mirror, with actions that act on the store.

Rows are never edited here (an edit would not reach the store). Opening the
sessions list or a session first syncs the sessions written since the last sync.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, F, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.dateformat import format as format_date
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil

from persistent_memory.admin.base import ReadOnlyMixin, pretty_json, short_when, when
from persistent_memory.admin.checkpoints import checkpoints_html, is_thread, messages_html
from persistent_memory.admin.conversations import ConversationInline
from persistent_memory.admin.forget import ForgetOwnersMixin
from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.models import HistoryEntry, MemorySession, MemoryValue
from persistent_memory.operations import maintenance
from persistent_memory.store import get_store


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "live"), ("expired", "expired"), ("gone", "gone (deleted)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        now = timezone.now()
        live = Q(state=MemorySession.State.LIVE)
        unexpired = Q(expires_at__isnull=True) | Q(expires_at__gt=now)
        if self.value() == "live":
            return queryset.filter(live & unexpired)
        if self.value() == "expired":
            return queryset.filter(Q(state=MemorySession.State.EXPIRED) | (live & Q(expires_at__lte=now)))
        if self.value() == "gone":
            return queryset.filter(state=MemorySession.State.DELETED)
        return queryset


class TTLFilter(admin.SimpleListFilter):
    title = "TTL"
    parameter_name = "ttl"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "expires"), ("idle", "expires when idle"), ("no", "never expires")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "idle":
            # Sessions their idle TTL can end: not those whose fixed TTL is no longer (the
            # memory backend's 30-day default is on sessions with a 1-hour TTL too), which
            # the list shows without "if idle".
            can_end = Q(ttl_seconds__isnull=True) | Q(idle_ttl_seconds__lt=F("ttl_seconds"))
            return queryset.filter(Q(idle_ttl_seconds__isnull=False) & can_end)
        if self.value() in ("yes", "no"):
            return queryset.filter(expires_at__isnull=self.value() == "no")
        return queryset


class OwnerFilter(admin.SimpleListFilter):
    """Unowned sessions, or one owner's: the 20 owners with most sessions are offered, and
    any other works as ``?owner=...`` (the search box finds owners by prefix)."""

    title = "owner"
    parameter_name = "owner"
    UNOWNED = "-"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        top = (
            MemorySession.objects.exclude(owner="")
            .values("owner")
            .annotate(sessions=Count("pk"))
            .order_by("-sessions", "owner")[:20]
        )
        return [(self.UNOWNED, "unowned (the node's)"), *((row["owner"], row["owner"]) for row in top)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(owner="" if value == self.UNOWNED else value)


class SyncFilter(admin.SimpleListFilter):
    """Sessions the mirror could not write at its last try (it keeps retrying them)."""

    title = "mirror sync"
    parameter_name = "sync"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("failing", "failing"), ("ok", "ok")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() in ("failing", "ok"):
            return queryset.filter(sync_failed_at__isnull=self.value() == "ok")
        return queryset


class ValueInline(ReadOnlyMixin, admin.TabularInline):
    model = MemoryValue
    fields = ("key", "pretty_value")
    readonly_fields = fields
    extra = 0
    verbose_name = "value"
    verbose_name_plural = "values"

    @admin.display(description="value")
    def pretty_value(self, obj: MemoryValue) -> str:
        return format_html("<pre style='margin:0'>{}</pre>", pretty_json(obj.value))


class HistoryInline(ReadOnlyMixin, admin.TabularInline):
    model = HistoryEntry
    fields = ("position", "time", "entry")
    readonly_fields = fields
    ordering = ("-position",)
    extra = 0
    verbose_name = "history entry"
    verbose_name_plural = "session history (newest first)"

    @admin.display(description="time")
    def time(self, obj: HistoryEntry) -> str:
        return format_date(timezone.localtime(obj.timestamp), "Y-m-d H:i:s")

    @admin.display(description="entry")
    def entry(self, obj: HistoryEntry) -> str:
        return obj.describe()


def _storage_ids(queryset: QuerySet) -> list[str]:
    """The store's ids of the selected sessions (every owner's)."""
    return [row.storage_id for row in queryset.only("owner", "session_id")]


def idle_since(session: MemorySession) -> datetime | None:
    """When the session was last written, if its idle TTL is what ends it (its expiry is
    then that write plus the idle TTL, before any fixed deadline); None otherwise."""
    if session.idle_ttl_seconds is None or session.expires_at is None:
        return None
    if session.ttl_seconds is not None:
        deadline = session.created_at + timedelta(seconds=session.ttl_seconds)
        if session.expires_at >= deadline - timedelta(milliseconds=1):
            return None
    return session.expires_at - timedelta(seconds=session.idle_ttl_seconds)


def state_label(session: MemorySession, now: datetime | None = None) -> str:
    """live, expired or gone, as the admin shows it."""
    if session.state == MemorySession.State.DELETED:
        return "gone"
    expired = session.expires_at is not None and session.expires_at <= (now or timezone.now())
    return "expired" if session.state == MemorySession.State.EXPIRED or expired else "live"


def duration(seconds: float) -> str:
    """A time to live as people say it: "1 hour", "1 day, 12 hours"."""
    now = timezone.now()
    return timeuntil(now + timedelta(seconds=seconds), now)


@admin.register(MemorySession)
class MemorySessionAdmin(ForgetOwnersMixin, ReadOnlyMixin, admin.ModelAdmin):
    # State second: it is what staff scan for, and it stays in view on narrow screens. The
    # columns fit a 1,280 px screen beside the navigation and the filters; the creation
    # time and the exact expiry are on each session's page.
    list_display = (
        "session",
        "state_display",
        "owner_display",
        "keys",
        "history",
        "expires",
        "last_active",
        "synced",
    )
    list_filter = (StateFilter, TTLFilter, OwnerFilter, SyncFilter)
    search_fields = ("^session_id", "^owner")  # prefix searches use the indexes
    date_hierarchy = "last_activity"
    ordering = ("-last_activity",)
    list_per_page = 100
    show_full_result_count = False
    # The page shows what staff act on; the mirror's bookkeeping (history_digest,
    # journal_seq) stays out of it.
    fieldsets = (
        (None, {"fields": ("session", "owner_name", "state_display")}),
        (
            "Lifetime",
            {
                "fields": (
                    "created",
                    "expires_at_display",
                    "time_to_live",
                    "idle_expiry",
                    "last_activity_display",
                )
            },
        ),
        ("Contents", {"fields": ("keys", "history_entries")}),
        ("Mirror", {"fields": ("mirror_sync",)}),
    )
    readonly_fields = (
        "session",
        "owner_name",
        "state_display",
        "created",
        "expires_at_display",
        "time_to_live",
        "idle_expiry",
        "last_activity_display",
        "keys",
        "history_entries",
        "graph_messages",
        "checkpoints",
        "mirror_sync",
    )
    # Conversations first: transcripts lead the session page.
    inlines = (ConversationInline, ValueInline, HistoryInline)
    actions = (
        "summarize_now",
        "summarize_conversations_now",
        "export_json",
        "clear_keys",
        "delete_from_store",
        "forget_owners",
    )

    class Media:
        css = {"all": ("persistent_memory/admin.css",)}

    @admin.display(description="session ID", ordering="session_id")
    def session(self, obj: MemorySession) -> str:
        return obj.session_id

    @admin.display(description="owner", ordering="owner")
    def owner_display(self, obj: MemorySession) -> str:
        return obj.owner or "—"

    @admin.display(description="owner")
    def owner_name(self, obj: MemorySession) -> str:
        return obj.owner or "none: the unowned namespace (the node's)"

    @admin.display(description="keys", ordering="key_count")
    def keys(self, obj: MemorySession) -> int:
        return obj.key_count

    @admin.display(description="history", ordering="history_length")
    def history(self, obj: MemorySession) -> int:
        return obj.history_length

    @admin.display(description="history entries")
    def history_entries(self, obj: MemorySession) -> int:
        return obj.history_length

    @admin.display(description="checkpoints (read from the store)")
    def checkpoints(self, obj: MemorySession) -> str:
        return checkpoints_html(obj)

    @admin.display(description="messages")
    def graph_messages(self, obj: MemorySession) -> str:
        return messages_html(obj)

    def get_fieldsets(self, request: HttpRequest, obj: MemorySession | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not is_thread(obj):
            return fieldsets
        # A LangGraph thread's session: its chat and its checkpoints, before the mirror's bookkeeping.
        graph = [
            ("Graph messages (the latest checkpoint's)", {"fields": ("graph_messages",)}),
            ("Graph checkpoints", {"fields": ("checkpoints",)}),
        ]
        return [*fieldsets[:-1], *graph, fieldsets[-1]]

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: MemorySession) -> str:
        return when(obj.created_at)

    @admin.display(description="last activity", ordering="last_activity")
    def last_active(self, obj: MemorySession) -> str:
        return format_html(
            '<span title="{}">{}</span>', when(obj.last_activity), short_when(obj.last_activity)
        )

    @admin.display(description="last activity")
    def last_activity_display(self, obj: MemorySession) -> str:
        return when(obj.last_activity)

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, obj: MemorySession) -> str:
        """How long the session has left (the exact time on its page, and on hover); "if
        idle" when its idle TTL is what ends it."""
        if obj.expires_at is None:
            return "never"
        if obj.expires_at <= timezone.now():
            left = f"{timesince(obj.expires_at, depth=1)} ago"
        else:
            left = f"in {timeuntil(obj.expires_at, depth=1)}"
        shown = format_html('<span title="{}">{}</span>', when(obj.expires_at), left)
        if idle_since(obj) is None:
            return shown
        # Its own span, so that the cell may wrap before it (admin.css): with the memory
        # backend's default idle expiry every row says it, and a 1,280 px screen has no
        # room for it beside the time left.
        idle = f"{duration(obj.idle_ttl_seconds)} after its last write"
        return format_html('{} <span title="{}">if idle</span>', shown, idle)

    @admin.display(description="idle expiry")
    def idle_expiry(self, obj: MemorySession) -> str:
        if obj.idle_ttl_seconds is None:
            return "none"
        text = f"{duration(obj.idle_ttl_seconds)} after the last write"
        last_write = idle_since(obj)
        if last_write is not None:
            text += f"; idle for {timesince(last_write)} as of the last sync"
        else:
            text += "; the fixed time to live ends it first"
        return text

    @admin.display(description="expires", ordering="expires_at")
    def expires_at_display(self, obj: MemorySession) -> str:
        if obj.expires_at is None:
            return "never"
        if obj.expires_at <= timezone.now():
            return f"{when(obj.expires_at)} ({timesince(obj.expires_at)} ago)"
        return f"{when(obj.expires_at)} (in {timeuntil(obj.expires_at)})"

    @admin.display(description="time to live")
    def time_to_live(self, obj: MemorySession) -> str:
        if obj.ttl_seconds is None:
            return "none: the session never expires"
        return f"{duration(obj.ttl_seconds)} from creation"

    @admin.display(description="state", ordering="state")
    def state_display(self, obj: MemorySession) -> str:
        label = state_label(obj)
        return f"{label} (since {when(obj.gone_at)})" if label == "gone" and obj.gone_at else label

    @admin.display(description="synced", boolean=True, ordering="sync_failed_at")
    def synced(self, obj: MemorySession) -> bool:
        """False while the mirror cannot write the session (the page says why)."""
        return obj.sync_failed_at is None

    @admin.display(description="last sync")
    def mirror_sync(self, obj: MemorySession) -> str:
        """When this copy was read from the store, or why the mirror cannot write it."""
        if obj.sync_failed_at is not None:
            return f"failing since {when(obj.sync_failed_at)} (retried at every sync): {obj.sync_error}"
        return f"{when(obj.synced_at)}, ok"

    def has_manage_permission(self, request: HttpRequest) -> bool:
        """Acting on the store (delete, clear, summarize) takes the model's delete permission."""
        return request.user.has_perm("persistent_memory.delete_memorysession")

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 says where the actions are offered (action_location); 5.2 does not.
        actions = super().get_actions(request, *(() if action_location is None else (action_location,)))
        actions.pop("delete_selected", None)  # it would delete rows, not sessions
        return actions

    # Every page shows the store as it is now --------------------------------

    def _sync(self, request: HttpRequest) -> None:
        store = get_store()
        if not store.mirror.enabled:
            return
        try:
            store.mirror.sync_dirty(limit=memory_settings.ADMIN_SYNC_LIMIT)
        except PersistentMemoryError as exc:
            self.message_user(request, f"Showing the mirror as last synced: {exc}", messages.WARNING)

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        self._sync(request)
        store = get_store()
        context = {
            "store_backend": store.backend.describe(),
            "mirror_mode": store.mirror.mode,
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ):
        self._sync(request)
        return super().change_view(request, object_id, form_url, extra_context)

    # Actions: the store first, then the mirror -------------------------------

    def _confirm(self, request: HttpRequest, queryset: QuerySet, action: str, what: str) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": f"{what}: are you sure?",
            "what": what,
            "action": action,
            "sessions": queryset,
            "opts": self.model._meta,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/persistent_memory/confirm_action.html", context)

    def _act(
        self, request: HttpRequest, queryset: QuerySet, run: Any, *, confirm: tuple[str, str] | None = None
    ) -> TemplateResponse | None:
        """Run ``run(session_ids) -> message`` on the store, then sync those sessions.

        ``confirm`` (action name, what it does) asks first, for destructive actions.
        """
        if confirm is not None and request.POST.get("confirmed") != "yes":
            return self._confirm(request, queryset, *confirm)
        ids = _storage_ids(queryset)
        store = get_store()
        try:
            message = run(ids)
        except PersistentMemoryError as exc:
            # Sessions before the failing one may have been changed: say so, and sync.
            self.message_user(
                request, f"Stopped by an error; some sessions may have changed: {exc}", messages.ERROR
            )
        else:
            self.message_user(request, message, messages.SUCCESS)
        if store.mirror.enabled:
            store.mirror.sync_sessions(ids)
        return None

    @admin.action(description="Delete selected sessions from the store", permissions=["manage"])
    def delete_from_store(self, request: HttpRequest, queryset: QuerySet) -> TemplateResponse | None:
        return self._act(
            request,
            queryset,
            lambda ids: f"Deleted {maintenance.delete_sessions(ids)} of {len(ids)} sessions from the store.",
            confirm=("delete_from_store", "Delete these sessions with all their values and history"),
        )

    @admin.action(description="Clear all keys of selected sessions", permissions=["manage"])
    def clear_keys(self, request: HttpRequest, queryset: QuerySet) -> TemplateResponse | None:
        return self._act(
            request,
            queryset,
            lambda ids: f"Cleared {maintenance.clear_sessions(ids)} keys from {len(ids)} sessions.",
            confirm=("clear_keys", "Clear every key of these sessions"),
        )

    @admin.action(description="Summarize history of selected sessions now", permissions=["manage"])
    def summarize_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        def summarize(ids: list[str]) -> str:
            report = maintenance.summarize_sessions(ids)
            counts = f"{report.summarized} of {report.scanned} sessions ({report.folded} entries folded)"
            return f"Summarized {counts}."

        self._act(request, queryset, summarize)

    @admin.action(description="Summarize the conversations of selected sessions now", permissions=["manage"])
    def summarize_conversations_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        def summarize(ids: list[str]) -> str:
            committed, tried = maintenance.summarize_conversations_now(ids)
            state = get_store().summarizer_worker.health.state
            return f"Summarized {committed} of {tried} conversations (summarizers: {state})."

        self._act(request, queryset, summarize)

    @admin.action(description="Export selected sessions as JSON", permissions=["view"])
    def export_json(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        records = list(maintenance.export_sessions(_storage_ids(queryset)))
        response = HttpResponse(json.dumps(records, indent=2), content_type="application/json")
        name = f"memory-sessions-{timezone.now():%Y%m%d-%H%M%S}.json"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response


@admin.register(HistoryEntry)
class HistoryEntryAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("timestamp", "session_link", "op", "key", "entry")
    list_filter = ("op",)
    search_fields = ("session__session_id", "session__owner", "key")
    list_select_related = ("session",)
    ordering = ("-timestamp",)
    list_per_page = 100
    show_full_result_count = False

    @admin.display(description="session", ordering="session__session_id")
    def session_link(self, obj: HistoryEntry) -> str:
        url = reverse("admin:persistent_memory_memorysession_change", args=[obj.session_id])
        return format_html('<a href="{}">{}</a>', url, obj.session.session_id)

    @admin.display(description="entry")
    def entry(self, obj: HistoryEntry) -> str:
        return obj.describe()

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        return {}
