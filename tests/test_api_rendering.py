"""The lanes' answers: the window's messages written as stored, and the lane's message
prepared as the general path prepares it."""

from __future__ import annotations

import json

import pytest
from rest_framework.renderers import JSONRenderer

from persistent_memory.api import rendering
from persistent_memory.api.rendering import parsed, render_json
from persistent_memory.chat import messages
from persistent_memory.conversations.store import ChatJSON, _chats
from persistent_memory.exceptions import InvalidMessage


def stored(content: str, **extra: object) -> bytes:
    """A stored text as the backends write it (ASCII: ``json.dumps``'s escapes)."""
    body = {"id": "m1", "parent_id": None, "seq": 1, "role": "user", "content": content, **extra}
    return json.dumps({**body, "tokens": 5, "tokenizer": "o200k_base", "created_at": 1.5}).encode()


TEXTS = [stored('Où? "quoted" \u2028 😀'), stored("second, ")]


def test_the_window_is_cut_out_not_parsed():
    window = _chats(TEXTS, as_json=True)
    assert isinstance(window, ChatJSON)
    assert (
        json.loads(window)
        == _chats(TEXTS)
        == [
            {"role": "user", "content": 'Où? "quoted" \u2028 😀'},
            {"role": "user", "content": "second, "},
        ]
    )


def test_a_text_with_metadata_is_parsed():
    texts = [*TEXTS, stored("x", metadata={"role": "not sent"})]
    assert _chats(texts, as_json=True) == _chats(texts)
    assert not isinstance(_chats(texts, as_json=True), ChatJSON)


@pytest.mark.parametrize("marked", [False, True])
def test_the_answer_holds_the_same_json_as_drfs(marked):
    # A body holding the renderer's own mark (it cannot know it; if it did) gets the slow
    # way, with the same answer.
    text = rendering._MARK + "0" if marked else "é \u2028 \u2029"
    body = {
        "question": {"text": text, "metadata": {"conversation": {"messages": _chats(TEXTS, as_json=True)}}}
    }
    expected = {"question": {"text": text, "metadata": {"conversation": {"messages": _chats(TEXTS)}}}}
    rendered = render_json(body)
    assert json.loads(rendered) == expected == parsed(body)
    assert b"\xe2\x80\xa8" not in rendered  # U+2028 escaped, as DRF's renderer does


def test_an_answer_without_a_window_is_drfs_bytes():
    body = {"answer": {"text": "é", "metadata": {"session_id": "s"}}, "memory": {"answer_count": 1}}
    assert render_json(body) == JSONRenderer().render(body)


@pytest.mark.parametrize("text", ["Paris.", 'é "\\ \u2028', "😀" * 3])
def test_a_lane_message_is_stored_as_the_general_path_stores_it(text, monkeypatch):
    monkeypatch.setattr(messages.time, "time", lambda: 1764412345.5)
    monkeypatch.setattr(messages, "new_message_id", lambda now: "id-1")
    general = messages.prepare_messages(
        [{"role": "assistant", "content": text}],
        tokenizer="o200k_base",
        max_batch=1,
        max_message_bytes=1000,
        max_depth=2,
    )[0]
    assert messages.prepare_text("assistant", text, tokenizer="o200k_base", max_message_bytes=1000) == general


@pytest.mark.parametrize("text", ["\ud800 lone", "x" * 1000])
def test_a_lane_message_is_refused_as_the_general_path_refuses_it(text):
    with pytest.raises(InvalidMessage) as general:
        messages.prepare_messages(
            [{"role": "user", "content": text}],
            tokenizer="o200k_base",
            max_batch=1,
            max_message_bytes=1000,
            max_depth=2,
        )
    with pytest.raises(InvalidMessage) as lane:
        messages.prepare_text("user", text, tokenizer="o200k_base", max_message_bytes=1000)
    assert str(lane.value) == str(general.value)
