"""A window's chat messages are read from the chat fields of the stored texts alone
(``conversations.store._chats``): for any message, what that gives equals the chat
fields of the whole stored text, parsed."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from persistent_memory.chat.messages import chat_message, prepare_messages, stored_text
from persistent_memory.conversations.store import _chats

# Text that looks like the markers the fast path looks for, among any other.
MARKERS = ['"tokens": 1', ', "tokens": ', '"metadata": {}', ', "role": "x"', '\\"', "}, {"]
text = st.one_of(st.text(), st.sampled_from(MARKERS), st.lists(st.sampled_from(MARKERS)).map("".join))
metadata = st.none() | st.dictionaries(st.sampled_from(["tokens", "role", "metadata", "k"]), text, max_size=3)


@st.composite
def messages(draw: Any) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "assistant", "system"]))
    message: dict[str, Any] = {"role": role, "content": draw(text)}
    if draw(st.booleans()):
        message["name"] = draw(st.from_regex(r"[a-zA-Z0-9_-]{1,16}", fullmatch=True))
    if role == "assistant" and draw(st.booleans()):
        message["content"] = None
        message["tool_calls"] = [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": draw(text)}}
        ]
    found = draw(metadata)
    if found is not None:
        message["metadata"] = found
    return message


@given(st.lists(messages(), min_size=1, max_size=5), st.booleans())
def test_the_chat_fields_read_alone_equal_the_whole_text_parsed(batch, as_bytes):
    prepared = prepare_messages(
        batch, tokenizer="chars", max_batch=100, max_message_bytes=1 << 20, max_depth=100
    )
    texts = [stored_text(p.id, None, seq, p.body) for seq, p in enumerate(prepared, 1)]
    stored = [text.encode() for text in texts] if as_bytes else texts
    assert _chats(stored) == [chat_message(json.loads(text)) for text in texts]
    assert _chats([]) == []
