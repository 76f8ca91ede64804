"""The admin's long-term memories: the database is their source of truth, so they are
editable here. Saving goes through the service (the same rules as the API: validated,
tokens counted, the vector renewed) and marks the memory as the admin's, which an
extraction then never overwrites. The list shows current memories; its "version" filter
shows the superseded versions a write replaced, read-only, each linked from its memory's
page. Selected memories export as JSON Lines; "Forget everything about the owners of the
selected long-term memories" is in admin_forget."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, StreamingHttpResponse
from django.urls import reverse
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import Truncator

from persistent_memory.admin.base import short_when, when
from persistent_memory.admin.forget import ForgetOwnersMixin
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.memories import memories_for, records
from persistent_memory.memories.jsonl import export_lines
from persistent_memory.memories.lifecycle import current_filter
from persistent_memory.models import LongTermMemory
from persistent_memory.owners import validate_owner

EDITED = ("session_id", "type", "key", "content", "metadata", "said_at", "happened_at", "expires_at")
#: After each separator of a key: where the list may break it.
KEY_BREAKS = re.compile(r"(?<=[._:/-])")


class LongTermMemoryForm(forms.ModelForm):
    """Checks what the service would refuse, so the admin shows it on the form."""

    class Meta:
        model = LongTermMemory
        fields = ("owner", *EDITED)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        checks = {
            "owner": validate_owner,
            "content": records.validate_content,
            "key": records.validate_memory_key,
            "session_id": records.validate_memory_session,
            "metadata": records.validate_metadata,
        }
        for name, check in checks.items():
            if name in data:
                try:
                    data[name] = check(data[name])
                except PersistentMemoryError as exc:
                    self.add_error(name, str(exc))
        owner = self.instance.owner if self.instance.pk else data.get("owner", "")
        taken = (
            LongTermMemory.objects.filter(owner=owner, key=data.get("key"))
            .filter(current_filter())
            .exclude(pk=self.instance.pk)
        )
        if data.get("key") and taken.exists():
            self.add_error("key", "Another memory of this owner has this key.")
        return data


class VersionFilter(admin.SimpleListFilter):
    """Current memories by default; their superseded versions, or both, when asked."""

    title = "version"
    parameter_name = "version"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("superseded", "Superseded"), ("all", "All")]

    def choices(self, changelist: Any) -> Any:
        # "Current" stands where Django puts "All": it is what no parameter shows.
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "Current",
        }
        for value, title in self.lookup_choices:
            yield {
                "selected": self.value() == value,
                "query_string": changelist.get_query_string({self.parameter_name: value}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[LongTermMemory]) -> QuerySet[LongTermMemory]:
        if self.value() == "all":
            return queryset
        if self.value() == "superseded":
            return queryset.exclude(current_filter())
        return queryset.filter(current_filter())


@admin.register(LongTermMemory)
class LongTermMemoryAdmin(ForgetOwnersMixin, admin.ModelAdmin):
    form = LongTermMemoryForm
    # What a reader scans for; uses and tokens are on each memory's page. With the
    # navigation and the filters open, these fit 1,280 px.
    list_display = ("key_display", "short_content", "owner", "type_and_source", "updated")
    list_filter = (VersionFilter, "type", "source", "owner")
    search_fields = ("content", "key", "owner")
    date_hierarchy = "updated_at"
    readonly_fields = (
        "source",
        "source_messages",
        "created_at",
        "updated_at",
        "access_count",
        "last_accessed_at",
        "tokens",
        "embedding_model",
        "embedding_dimensions",
        "history",
        "superseded_by",
        "valid_until",
        "versions",
        "similar_memories",
    )
    actions = ("export_jsonl", "forget_owners")

    class Media:
        css = {"all": ("persistent_memory/admin.css",)}

    @admin.display(description="key", ordering="key")
    def key_display(self, obj: LongTermMemory) -> str:
        """The key, breaking after its separators (``travel.`` ``seat``) rather than mid-word."""
        return mark_safe("<wbr>".join(escape(part) for part in KEY_BREAKS.split(obj.key)))  # noqa: S308 - escaped

    @admin.display(description="type, source", ordering="type")
    def type_and_source(self, obj: LongTermMemory) -> str:
        return format_html('{}<br><span class="quiet">{}</span>', obj.type, obj.source)

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: LongTermMemory) -> str:
        # Short, as the sessions list's times: the column stays narrow (the full time on hover).
        return format_html('<span title="{}">{}</span>', when(obj.updated_at), short_when(obj.updated_at))

    @admin.display(description="content")
    def short_content(self, obj: LongTermMemory) -> str:
        return Truncator(obj.content).chars(80)

    @admin.display(description="similar memories")
    def similar_memories(self, obj: LongTermMemory) -> str:
        """The owner's memories nearest this one in meaning (the service's ``similar``)."""
        if not obj.pk:
            return "-"
        try:
            found = memories_for(obj.owner).similar(obj.pk, limit=10)
        except PersistentMemoryError:
            found = []
        if not found:
            return "None (no vector of the current EMBEDDER's model, or no other memory of the owner)."
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                '<li><a href="{}">{}</a> ({}): {}</li>',
                (
                    (
                        reverse("admin:persistent_memory_longtermmemory_change", args=[memory["id"]]),
                        memory["key"],
                        f"{memory['score']:.3f}",
                        Truncator(memory["content"]).chars(120),
                    )
                    for memory in found
                ),
            ),
        )

    @admin.display(description="older versions")
    def versions(self, obj: LongTermMemory) -> str:
        """What the memory said before writes replaced it, newest first (the service's ``versions``)."""
        try:
            found = memories_for(obj.owner).versions(obj.pk) if obj.pk else []
        except PersistentMemoryError:
            found = []
        if not found:
            return "None."
        return format_html(
            '<table class="memory-versions"><thead><tr><th>content</th><th>said at</th>'
            "<th>valid until</th></tr></thead><tbody>{}</tbody></table>",
            format_html_join(
                "",
                '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td></tr>',
                (
                    (
                        reverse("admin:persistent_memory_longtermmemory_change", args=[version["id"]]),
                        version["content"],
                        when(version["said_at"]),
                        when(version["valid_until"]),
                    )
                    for version in found
                ),
            ),
        )

    def has_change_permission(self, request: HttpRequest, obj: LongTermMemory | None = None) -> bool:
        # A superseded version is a record of what was: read-only, deleted with its memory.
        return (obj is None or obj.superseded_by_id is None) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: LongTermMemory | None = None) -> bool:
        return (obj is None or obj.superseded_by_id is None) and super().has_delete_permission(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: LongTermMemory | None = None) -> tuple[str, ...]:
        # The owner is chosen on creation; moving a memory to another owner is a new one.
        return (*self.readonly_fields, "owner") if obj else self.readonly_fields

    def save_model(
        self, request: HttpRequest, obj: LongTermMemory, form: forms.ModelForm, change: bool
    ) -> None:
        fields = {name: form.cleaned_data.get(name) for name in EDITED}
        if change:
            saved = memories_for(obj.owner).update(obj.pk, **fields, source="admin")
        else:
            content = fields.pop("content")
            saved = memories_for(obj.owner).add(content, source="admin", **fields)
        obj.pk = saved["id"]
        obj.refresh_from_db()

    @admin.action(description="Export selected memories as JSON Lines")
    def export_jsonl(self, request: HttpRequest, queryset: QuerySet[LongTermMemory]) -> StreamingHttpResponse:
        response = StreamingHttpResponse(export_lines(queryset), content_type="application/x-ndjson")
        response["Content-Disposition"] = 'attachment; filename="memories.jsonl"'
        return response
