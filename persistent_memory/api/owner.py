"""``owner/``: what the app holds about the caller's own owner, and forgetting all of it.

The owner is the one ``OWNER_RESOLVER`` gives the request, as everywhere in the API: no
parameter names an owner, so a caller can only ever forget themselves. ``DELETE`` needs
the header ``Confirm-Forget: yes`` (anything else is 400 ``confirmation_required``), so
a stray ``DELETE`` from a script or a proxy's retry of a bodiless request cannot wipe an
owner by accident. Forgetting is idempotent: sent again, it deletes nothing and answers
zeros.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response

from persistent_memory.api.views import MemoryAPIView, OwnerRequired, errors
from persistent_memory.operations.forget import forget_owner, owner_holdings

TAG = "owner"
CONFIRM_HEADER = "Confirm-Forget"
CONFIRM_VALUE = "yes"

CONFIRM = OpenApiParameter(
    CONFIRM_HEADER,
    str,
    location=OpenApiParameter.HEADER,
    required=True,
    pattern=f"^{CONFIRM_VALUE}$",
    description=f"Must be `{CONFIRM_VALUE}`: forgetting cannot be undone.",
    examples=[OpenApiExample(CONFIRM_VALUE, value=CONFIRM_VALUE)],
)


class ConfirmationRequired(APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = f"Forgetting deletes everything held about you: send the header {CONFIRM_HEADER}: yes."
    default_code = "confirmation_required"


class OwnerHoldings(serializers.Serializer):
    owner = serializers.CharField(help_text="The caller's owner, resolved by the server.")
    sessions = serializers.IntegerField(help_text="Live sessions in the store.")
    mirror_rows = serializers.IntegerField(help_text="Sessions in the admin's mirror (gone ones too).")
    memories = serializers.IntegerField(help_text="Long-term memories (expired ones not swept yet too).")


class ForgetReport(serializers.Serializer):
    owner = serializers.CharField()
    sessions = serializers.IntegerField(help_text="Live sessions deleted with all they held.")
    expired_sessions = serializers.IntegerField(help_text="Expired sessions' leftovers swept.")
    records = serializers.IntegerField(help_text="Idempotency records and run bindings deleted.")
    mirror_rows = serializers.IntegerField()
    memories = serializers.IntegerField()
    journal_checkpointed = serializers.BooleanField(
        help_text="The memory backend's journal was checkpointed (segments with the owner's writes dropped)."
    )


class OwnerView(MemoryAPIView):
    def initial(self, request: Request, *args: object, **kwargs: object) -> None:
        super().initial(request, *args, **kwargs)
        if self.owner == "":
            # OWNER_RESOLVER shares one namespace among every caller: it is no one's to forget.
            raise OwnerRequired(
                "Every caller shares the unowned namespace here (OWNER_RESOLVER): it is no one's to forget."
            )

    @extend_schema(
        responses={200: OwnerHoldings, **errors()},
        operation_id="owner_holdings",
        tags=[TAG],
        summary="What the app holds about the caller's owner",
    )
    def get(self, request: Request) -> Response:
        return Response(owner_holdings(self.owner or ""))

    @extend_schema(
        parameters=[CONFIRM],
        examples=[
            OpenApiExample(
                "Forgotten",
                value={
                    "owner": "user:42",
                    "sessions": 2,
                    "expired_sessions": 0,
                    "records": 1,
                    "mirror_rows": 2,
                    "memories": 3,
                    "journal_checkpointed": False,
                },
                response_only=True,
            )
        ],
        responses={200: ForgetReport, **errors()},
        operation_id="owner_forget",
        tags=[TAG],
        summary="Forget everything the app holds about the caller's owner",
        description=(
            "Deletes the caller's sessions (values, history, conversations, summaries), "
            "idempotency records and run bindings, mirror rows, long-term memories and, on the "
            "memory backend, the journal's segments with their writes; answers the counts. "
            f"400 `confirmation_required` without `{CONFIRM_HEADER}: {CONFIRM_VALUE}`; "
            "403 `owner_required` when the request resolves no owner of its own."
        ),
    )
    def delete(self, request: Request) -> Response:
        if request.headers.get(CONFIRM_HEADER) != CONFIRM_VALUE:
            raise ConfirmationRequired()
        return Response(forget_owner(self.owner or ""))
