"""The admin: a read-only view of the mirror, with actions that act on the store.

Rows are never edited here (an edit would not reach the store). Opening the
sessions list or a session first syncs the sessions written since the last sync.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timeuntil

from persistent_memory import maintenance
from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.models import HistoryEntry, MemorySession, MemoryValue
from persistent_memory.store import get_store


class ReadOnlyMixin:
    """The mirror only changes through the store."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


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
        return [("yes", "expires"), ("no", "never expires")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
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


def pretty_json(text: str) -> str:
    """Stored JSON text indented for reading; control characters such as U+0000 stay
    visible as escapes. Text that is not JSON (written to Redis by another program) is
    shown as it is."""
    try:
        pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        pretty = text
    # A lone surrogate (only another program's data could hold one) as its escape.
    return pretty.encode("utf-8", "backslashreplace").decode()


class ValueInline(ReadOnlyMixin, admin.TabularInline):
    model = MemoryValue
    fields = ("key", "pretty_value")
    readonly_fields = fields
    extra = 0

    @admin.display(description="value")
    def pretty_value(self, obj: MemoryValue) -> str:
        return format_html("<pre style='margin:0'>{}</pre>", pretty_json(obj.value))


class HistoryInline(ReadOnlyMixin, admin.TabularInline):
    model = HistoryEntry
    fields = ("position", "timestamp", "entry")
    readonly_fields = fields
    ordering = ("-position",)
    extra = 0
    verbose_name_plural = "history (newest first)"

    @admin.display(description="entry")
    def entry(self, obj: HistoryEntry) -> str:
        return obj.describe()


def _storage_ids(queryset: QuerySet) -> list[str]:
    """The store's ids of the selected sessions (every owner's)."""
    return [row.storage_id for row in queryset.only("owner", "session_id")]


def state_label(session: MemorySession, now: datetime | None = None) -> str:
    """live, expired or gone, as the admin shows it."""
    if session.state == MemorySession.State.DELETED:
        return "gone"
    expired = session.expires_at is not None and session.expires_at <= (now or timezone.now())
    return "expired" if session.state == MemorySession.State.EXPIRED or expired else "live"


@admin.register(MemorySession)
class MemorySessionAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "session_id",
        "owner_display",
        "key_count",
        "history_length",
        "created_at",
        "expires",
        "last_activity",
        "state_display",
        "synced",
    )
    list_filter = (StateFilter, TTLFilter, OwnerFilter, SyncFilter)
    search_fields = ("^session_id", "^owner")  # prefix searches use the indexes
    date_hierarchy = "last_activity"
    ordering = ("-last_activity",)
    list_per_page = 100
    show_full_result_count = False
    readonly_fields = ("session_id", "owner", *MemorySession.SYNCED_FIELDS)
    inlines = (ValueInline, HistoryInline)
    actions = ("summarize_now", "export_json", "clear_keys", "delete_from_store")

    @admin.display(description="owner", ordering="owner")
    def owner_display(self, obj: MemorySession) -> str:
        return obj.owner or "—"

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, obj: MemorySession) -> str:
        if obj.expires_at is None:
            return "never"
        if obj.expires_at <= timezone.now():
            return f"{obj.expires_at:%Y-%m-%d %H:%M:%S} (past)"
        return f"{obj.expires_at:%Y-%m-%d %H:%M:%S} (in {timeuntil(obj.expires_at)})"

    @admin.display(description="state", ordering="state")
    def state_display(self, obj: MemorySession) -> str:
        return state_label(obj)

    @admin.display(description="synced", boolean=True, ordering="sync_failed_at")
    def synced(self, obj: MemorySession) -> bool:
        """False while the mirror cannot write the session (the page says why)."""
        return obj.sync_failed_at is None

    def has_manage_permission(self, request: HttpRequest) -> bool:
        """Acting on the store (delete, clear, summarize) takes the model's delete permission."""
        return request.user.has_perm("persistent_memory.delete_memorysession")

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
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

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}
