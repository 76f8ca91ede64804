"""Request and response shapes of the conversation endpoints (validation and the schema).

The messages of an append are not checked here: the store checks every one before
anything is written (see :mod:`persistent_memory.chat.messages`) and answers
``invalid_message`` or ``orphan_tool_result`` naming the message and the rule it breaks,
the same for Python callers and the API. The message serializers below only describe
messages for the OpenAPI schema.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from persistent_memory.chat.messages import (
    DEFAULT_CONVERSATION,
    MESSAGE_ID_PATTERN,
    NAME_PATTERN,
    ROLES,
)
from persistent_memory.conversations.summaries import HEALTH_STATES, OVERFLOWS, STRATEGIES
from persistent_memory.validation import INT64_MAX

CONVERSATION_HELP = (
    f'The conversation\'s name (default "{DEFAULT_CONVERSATION}"): 1-256 of letters, digits, '
    "'-', '_' or '.', as keys."
)
MESSAGE_ID_HELP = "1-128 of letters, digits, '_', '.', ':' or '-'"

# A string, or content parts as OpenAI takes them; null only on an assistant message with tool calls.
CONTENT_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {"type": {"type": "string"}, "text": {"type": "string"}},
                "required": ["type"],
            },
        },
    ],
    "nullable": True,
    "description": (
        'A string, or a list of content parts (`{"type": "text", "text": ...}`, images and other '
        "parts as the model's API takes them; a tool message's parts are text parts); null only on "
        "an assistant message with `tool_calls`."
    ),
}


@extend_schema_field(CONTENT_SCHEMA)
class ContentField(serializers.JSONField):
    pass


class ToolFunction(serializers.Serializer):
    name = serializers.CharField()
    arguments = serializers.CharField(help_text="The arguments as the JSON text the model wrote.")


class ToolCall(serializers.Serializer):
    id = serializers.CharField(max_length=256, help_text="1-256 characters without spaces.")
    type = serializers.ChoiceField(choices=["function"])
    function = ToolFunction()


class ChatMessage(serializers.Serializer):
    """A message in OpenAI's chat format: what a model is sent."""

    role = serializers.ChoiceField(choices=list(ROLES))
    content = ContentField(allow_null=True)
    name = serializers.RegexField(f"^{NAME_PATTERN.pattern}$", required=False)
    tool_calls = ToolCall(many=True, required=False, help_text="An assistant message's calls of tools.")
    tool_call_id = serializers.CharField(
        required=False, help_text="A tool message's answer to this call (open on its thread)."
    )


class NewMessage(ChatMessage):
    """A message to append: the chat format, an optional id of the caller's and metadata."""

    id = serializers.RegexField(
        f"^{MESSAGE_ID_PATTERN.pattern}$",
        required=False,
        help_text=(
            f"Optional, the caller's own ({MESSAGE_ID_HELP}); without one the store makes a unique "
            "id. Re-sending an id already stored with the same message is a no-op answered with "
            "the stored message (safe retries); with another message, 409 `message_conflict`."
        ),
    )
    metadata = serializers.DictField(required=False, help_text="Any JSON object; never sent to a model.")


class StoredMessage(ChatMessage):
    """A message as stored: the chat format, its metadata and the store's fields."""

    id = serializers.CharField()
    parent_id = serializers.CharField(allow_null=True, help_text="The message before it on its thread.")
    seq = serializers.IntegerField(help_text="Its place in the conversation (1, 2, ...), never reused.")
    metadata = serializers.DictField(required=False)
    tokens = serializers.IntegerField(help_text="Counted once, at append (with the per-message overhead).")
    tokenizer = serializers.CharField(help_text="The TOKENIZER that counted it.")
    created_at = serializers.FloatField(help_text="Epoch seconds.")


@extend_schema_field(NewMessage(many=True))
class MessagesField(serializers.Field):
    """The messages of an append, handed to the store as sent (it checks them)."""

    def to_internal_value(self, data: Any) -> Any:
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class MessagesAppend(serializers.Serializer):
    conversation = serializers.CharField(
        required=False, default=DEFAULT_CONVERSATION, trim_whitespace=False, help_text=CONVERSATION_HELP
    )
    messages = MessagesField(
        help_text=(
            "1 to MAX_BATCH (100) messages, appended in order as a chain. A tool message must answer "
            "a call open on its thread (its assistant message earlier in the batch or on the thread)."
        )
    )
    parent_id = serializers.CharField(
        required=False,
        allow_null=True,
        trim_whitespace=False,
        help_text=(
            "The message the first one follows (default: the head). An older message starts a "
            "branch, and the head moves to the new messages: a regenerated answer."
        ),
    )


class Appended(serializers.Serializer):
    conversation = serializers.CharField()
    head = serializers.CharField(help_text="The conversation's head now: the batch's last message.")
    messages = StoredMessage(many=True, help_text="The batch's messages as stored.")


class ConversationQuery(serializers.Serializer):
    conversation = serializers.CharField(
        required=False, default=DEFAULT_CONVERSATION, trim_whitespace=False, help_text=CONVERSATION_HELP
    )


class MessagesQuery(ConversationQuery):
    leaf = serializers.CharField(
        required=False,
        trim_whitespace=False,
        help_text="Read the thread that ends at this message instead of the head's.",
    )
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=INT64_MAX, help_text="Only the thread's newest N messages."
    )


class Thread(serializers.Serializer):
    conversation = serializers.CharField()
    head = serializers.CharField(allow_null=True, help_text="null: the conversation has no messages.")
    messages = StoredMessage(many=True, help_text="The thread, oldest first.")


class ContextQuery(ConversationQuery):
    max_tokens = serializers.IntegerField(
        required=False, min_value=1, max_value=INT64_MAX, help_text="Default: CONTEXT_MAX_TOKENS (8000)."
    )
    max_messages = serializers.IntegerField(
        required=False, min_value=1, max_value=INT64_MAX, help_text="Default: CONTEXT_MAX_MESSAGES (100)."
    )
    strategy = serializers.ChoiceField(
        choices=STRATEGIES,
        required=False,
        help_text="Default: CONTEXT_STRATEGY. rolling_summary adds the summary of what comes before.",
    )
    overflow = serializers.ChoiceField(
        choices=OVERFLOWS,
        required=False,
        help_text="With rolling_summary, what gives when summary and messages do not fit (default: "
        "CONTEXT_OVERFLOW); 'error' answers 422 context_overflow.",
    )


class Context(serializers.Serializer):
    conversation = serializers.CharField()
    messages = ChatMessage(
        many=True, help_text="What to send to the model, oldest first, in the chat format only."
    )
    tokens = serializers.IntegerField(help_text="Their tokens, within max_tokens.")
    truncated = serializers.BooleanField(help_text="Whether older messages of the thread were left out.")
    summary = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="rolling_summary only: the summary of the thread before the messages (null: none yet).",
    )
    summary_state = serializers.ChoiceField(
        choices=HEALTH_STATES, required=False, help_text="rolling_summary only: the summarizer's health."
    )


class ConversationSummary(serializers.Serializer):
    conversation = serializers.CharField()
    head = serializers.CharField(allow_null=True)
    message_count = serializers.IntegerField(help_text="Messages held, on every branch.")
    tokens = serializers.IntegerField(help_text="Their tokens, on every branch.")
    branch_count = serializers.IntegerField(help_text="Threads: 1 for a linear chat, one more per branch.")
    trimmed = serializers.IntegerField(help_text="Messages removed beyond MAX_MESSAGES.")


class Conversations(serializers.Serializer):
    conversations = ConversationSummary(many=True, help_text="By name.")


class HeadMove(serializers.Serializer):
    conversation = serializers.CharField(
        required=False, default=DEFAULT_CONVERSATION, trim_whitespace=False, help_text=CONVERSATION_HELP
    )
    message_id = serializers.CharField(
        trim_whitespace=False, help_text="Any message of the conversation: reads then follow its thread."
    )


class Head(serializers.Serializer):
    conversation = serializers.CharField()
    head = serializers.CharField()


class MessagesCleared(serializers.Serializer):
    conversation = serializers.CharField()
    removed = serializers.IntegerField(help_text="How many messages the conversation held (0: none).")
