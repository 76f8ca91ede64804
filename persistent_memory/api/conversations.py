"""REST views of conversations: each validates its input, makes one store call and shapes
the answer, like the views in :mod:`persistent_memory.api.views`.

The store checks the messages and ids and raises the errors (``invalid_message``,
``orphan_tool_result``, ``message_conflict``, ``message_not_found``,
``session_not_found``), which the app's exception handler answers as JSON. Every call
works on the caller's owner: another owner's session answers as one that does not exist.

The request examples work as they are, in this order, on any session: the user message
creates ``msg-1``, which the head example moves the head back to.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from persistent_memory.api import conversation_serializers as c
from persistent_memory.api.examples import SESSION_ID
from persistent_memory.api.views import IDEMPOTENCY_KEY, SESSION_ERRORS, WRITE_ERRORS, MemoryAPIView, errors

TAG = "conversations"

USER_MESSAGE = {"id": "msg-1", "role": "user", "content": "What is the weather in Paris?"}
TOOL_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}
ANSWER = {"role": "assistant", "content": "It is 18 C and sunny in Paris.", "metadata": {"model": "gpt-4o"}}

APPEND_EXAMPLES = [
    OpenApiExample(
        "A user message",
        value={"messages": [USER_MESSAGE]},
        description=(
            "Appends `msg-1` after the head (the first message of a new conversation). Sent again, "
            "it is answered as stored and not appended twice: a safe retry. The head example moves "
            "the head back to it."
        ),
        request_only=True,
    ),
    OpenApiExample(
        "A tool call and its result",
        value={"messages": [TOOL_CALL, TOOL_RESULT]},
        description="The model's call and the tool's result, appended together after the head.",
        request_only=True,
    ),
    OpenApiExample(
        "An answer with metadata",
        value={"messages": [ANSWER]},
        description="`metadata` is kept with the message and never sent to a model.",
        request_only=True,
    ),
    OpenApiExample(
        "A system prompt in another conversation",
        value={
            "conversation": "support",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": [{"type": "text", "text": "Hello!"}]},
            ],
        },
        description="A session holds any number of conversations; system messages stay in every window.",
        request_only=True,
    ),
    OpenApiExample(
        "Appended",
        value={
            "conversation": "default",
            "head": "msg-1",
            "messages": [
                {
                    **USER_MESSAGE,
                    "parent_id": None,
                    "seq": 1,
                    "tokens": 10,
                    "tokenizer": "o200k_base",
                    "created_at": 1767225600.0,
                }
            ],
        },
        response_only=True,
        status_codes=["201"],
    ),
]

CONTEXT_EXAMPLE = OpenApiExample(
    "A window",
    value={
        "conversation": "default",
        "messages": [{"role": "user", "content": USER_MESSAGE["content"]}],
        "tokens": 10,
        "truncated": False,
    },
    response_only=True,
    status_codes=["200"],
)


class MessagesView(MemoryAPIView):
    @extend_schema(
        parameters=[SESSION_ID, c.MessagesQuery],
        responses={200: c.Thread, **SESSION_ERRORS},
        operation_id="messages_list",
        tags=[TAG],
        summary="A conversation's current thread, oldest first",
        description=(
            "The thread that ends at the head (or at `leaf`): a regenerated answer replaces the "
            "one it branched from. An unknown conversation is empty (`head` null); an unknown "
            "`leaf` is 404 `message_not_found`."
        ),
    )
    def get(self, request: Request, session_id: str) -> Response:
        query = self.validated(c.MessagesQuery, request.query_params)
        return Response(self.store.get_messages(session_id, **query))

    @extend_schema(
        request=c.MessagesAppend,
        parameters=[SESSION_ID, IDEMPOTENCY_KEY],
        responses={201: c.Appended, **errors(404, 409, 410, 422, 507)},
        examples=APPEND_EXAMPLES,
        operation_id="messages_append",
        tags=[TAG],
        summary="Append chat messages (creates the session)",
        description=(
            "Every message is checked before anything is written: 400 `invalid_message` (a role, "
            "shape, size or id the rules refuse; at most MAX_BATCH messages), 400 "
            "`orphan_tool_result` (a tool message answering no call open on its thread), 409 "
            "`message_conflict` (an id already stored with another message), 404 "
            "`message_not_found` (an unknown `parent_id`). A message re-sent with its id and the "
            "same content is answered as stored, not appended again. Beyond MAX_MESSAGES the "
            "oldest messages of the current thread are removed."
        ),
    )
    def post(self, request: Request, session_id: str) -> Response:
        once = self.idempotency()
        data = self.validated(c.MessagesAppend)
        appended = self.store.add_messages(
            session_id,
            data["messages"],
            conversation=data["conversation"],
            parent_id=data.get("parent_id"),
            idempotency=once,
        )
        return Response(appended, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[SESSION_ID, c.ConversationQuery, IDEMPOTENCY_KEY],
        responses={200: c.MessagesCleared, **WRITE_ERRORS},
        operation_id="messages_clear",
        tags=[TAG],
        summary="Remove a conversation with all its messages",
        description="Idempotent: `removed` is 0 when the conversation held nothing.",
    )
    def delete(self, request: Request, session_id: str) -> Response:
        conversation = self.validated(c.ConversationQuery, request.query_params)["conversation"]
        # The conversation comes from the query string: part of what the key stands for.
        once = self.idempotency(conversation)
        removed = self.store.clear_messages(session_id, conversation=conversation, idempotency=once)
        return Response({"conversation": conversation, "removed": removed})


class ContextView(MemoryAPIView):
    @extend_schema(
        parameters=[SESSION_ID, c.ContextQuery],
        responses={200: c.Context, **SESSION_ERRORS},
        examples=[CONTEXT_EXAMPLE],
        operation_id="messages_context",
        tags=[TAG],
        summary="What to send to the model now",
        description=(
            "The conversation's system messages, then the newest whole turn groups of the current "
            "thread within `max_tokens` and `max_messages`, oldest first, in the chat format only. "
            "A tool result is never without its call, nor a call without its results (but the "
            "newest, while its tools run)."
        ),
    )
    def get(self, request: Request, session_id: str) -> Response:
        query = self.validated(c.ContextQuery, request.query_params)
        return Response(self.store.get_context(session_id, **query))


class ConversationListView(MemoryAPIView):
    @extend_schema(
        parameters=[SESSION_ID],
        responses={200: c.Conversations, **SESSION_ERRORS},
        operation_id="conversations_list",
        tags=[TAG],
        summary="A session's conversations",
    )
    def get(self, request: Request, session_id: str) -> Response:
        return Response({"conversations": self.store.list_conversations(session_id)})


class HeadView(MemoryAPIView):
    @extend_schema(
        request=c.HeadMove,
        parameters=[SESSION_ID, IDEMPOTENCY_KEY],
        responses={200: c.Head, **WRITE_ERRORS},
        examples=[
            OpenApiExample(
                "Back to msg-1",
                value={"message_id": "msg-1"},
                description=(
                    '`msg-1` is the message the messages example "A user message" creates: send '
                    "that one first."
                ),
                request_only=True,
            )
        ],
        operation_id="messages_head",
        tags=[TAG],
        summary="Move the head to another message (another branch, or back)",
        description="404 `message_not_found` when the conversation has no such message.",
    )
    def put(self, request: Request, session_id: str) -> Response:
        once = self.idempotency()
        data = self.validated(c.HeadMove)
        head = self.store.set_head(
            session_id, data["message_id"], conversation=data["conversation"], idempotency=once
        )
        return Response({"conversation": data["conversation"], "head": head})
