"""Chat messages for the conversation tests, in OpenAI's chat format."""

from __future__ import annotations

from typing import Any


def user(content: str, **fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **fields}


def assistant(content: str | None, **fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **fields}


def system(content: str, **fields: Any) -> dict[str, Any]:
    return {"role": "system", "content": content, **fields}


def tool_call(call_id: str, name: str = "lookup", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calling(*call_ids: str, content: str | None = None, **fields: Any) -> dict[str, Any]:
    """An assistant message calling tools ``call_ids``."""
    return assistant(content, tool_calls=[tool_call(call_id) for call_id in call_ids], **fields)


def result(call_id: str, content: str = "42", **fields: Any) -> dict[str, Any]:
    """A tool message answering ``call_id``."""
    return {"role": "tool", "tool_call_id": call_id, "content": content, **fields}


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [message["id"] for message in messages]
