"""The admin action "Forget everything about the owners of the selected ...", on the
sessions and the memories lists: a confirmation page listing each owner with what will
be deleted, then :func:`~persistent_memory.operations.forget.forget_owner` for each, and
the counts in a message.

It deletes sessions and memories alike, so it takes both delete permissions.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Min, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.operations.forget import forget_owner, owner_holdings
from persistent_memory.owners import UNOWNED

#: Forgetting an owner deletes their sessions and their memories.
FORGET_PERMISSIONS = (
    "persistent_memory.delete_memorysession",
    "persistent_memory.delete_longtermmemory",
)
COUNTED = ("sessions", "expired_sessions", "records", "mirror_rows", "memories")


def _summary(owners: list[str], totals: dict[str, int]) -> str:
    return (
        f"Forgot {len(owners)} owner{'s' if len(owners) != 1 else ''} ({', '.join(owners)}): "
        f"{totals['sessions']} sessions, {totals['expired_sessions']} expired leftovers, "
        f"{totals['records']} idempotency records and run bindings, {totals['mirror_rows']} "
        f"mirror rows, {totals['memories']} long-term memories."
    )


class ForgetOwnersMixin:
    """For a ModelAdmin of a model with an ``owner`` field."""

    def has_forget_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perms(FORGET_PERMISSIONS)

    @admin.action(
        description="Forget everything about the owners of the selected %(verbose_name_plural)s",
        permissions=["forget"],
    )
    def forget_owners(self, request: HttpRequest, queryset: QuerySet) -> TemplateResponse | None:
        # One row per owner is enough to name them again when the page posts back.
        owned = queryset.exclude(owner=UNOWNED).values("owner")
        firsts = dict(owned.annotate(first=Min("pk")).values_list("owner", "first"))
        owners = sorted(firsts)
        unowned = queryset.filter(owner=UNOWNED).count()
        if not owners:
            self.message_user(  # type: ignore[attr-defined]
                request,
                "Nothing forgotten: the selected rows belong to the unowned namespace, which is everyone's.",
                messages.WARNING,
            )
            return None
        if request.POST.get("confirmed") != "yes":
            try:
                holdings = [owner_holdings(owner) for owner in owners]
            except PersistentMemoryError as exc:
                self.message_user(request, f"Cannot count what they hold: {exc}", messages.ERROR)  # type: ignore[attr-defined]
                return None
            return self._confirm_forget(request, holdings, [firsts[o] for o in owners], unowned)
        totals = dict.fromkeys(COUNTED, 0)
        done: list[str] = []
        for owner in owners:
            try:
                counts = forget_owner(owner)
            except PersistentMemoryError as exc:
                finished = f" (forgotten before it: {', '.join(done)})" if done else ""
                self.message_user(  # type: ignore[attr-defined]
                    request, f"Stopped at {owner} by an error{finished}: {exc}", messages.ERROR
                )
                return None
            done.append(owner)
            for name in COUNTED:
                totals[name] += counts[name]
        self.message_user(request, _summary(done, totals), messages.SUCCESS)  # type: ignore[attr-defined]
        return None

    def _confirm_forget(
        self, request: HttpRequest, holdings: list[dict[str, Any]], pks: list[Any], unowned: int
    ) -> TemplateResponse:
        opts = self.model._meta  # type: ignore[attr-defined]
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": "Forget these owners: are you sure?",
            "holdings": holdings,
            "pks": pks,
            "unowned": unowned,
            "action": "forget_owners",
            "opts": opts,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/persistent_memory/confirm_forget.html", context)
