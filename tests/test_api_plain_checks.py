"""The lane requests' plain checks (``serializers.PLAIN_CHECKS``) against their serializers:
a body the plain check accepts validates to the same data through the serializer, and a
body the serializer refuses is never accepted by the plain check."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.serializers import Serializer

from persistent_memory.api import serializers as s

ENTRY = {"text": "Where?", "metadata": {"session_id": "chat-1"}, "extra": [1, {"a": None}]}

BODIES: list[Any] = [
    {"question": ENTRY},
    {"answer": ENTRY},
    {"question": ENTRY, "answer": ENTRY},
    {"question": {}, "answer": {"text": ""}},
    {"question": ENTRY, "run_id": "run-1"},
    {"answer": ENTRY, "run_id": None},
    {"answer": ENTRY, "run_id": "r" * 128},
    {"answer": ENTRY, "run_id": "r" * 129},
    {"answer": ENTRY, "run_id": ""},
    {"answer": ENTRY, "run_id": "has space"},
    {"answer": ENTRY, "run_id": 42},
    {"answer": ENTRY, "run_id": True},
    {"answer": ENTRY, "run_id": "a\x00b"},
    {"answer": ENTRY, "run_id": ["run-1"]},
    {"question": ENTRY, "unknown": 1},
    {"question": None, "answer": None},
    {"question": "text", "answer": ["text"]},
    {"question": {"metadata": []}, "answer": {"text": "x", "metadata": "m"}},
    {"answer": {"text": 3}},
    {"answer": {"metadata": {}}},
    {},
    [],
    [{"question": ENTRY}],
    "question",
    None,
]


@pytest.mark.parametrize("serializer_class", list(s.PLAIN_CHECKS))
@pytest.mark.parametrize("body", BODIES)
def test_a_plain_check_accepts_only_what_its_serializer_accepts_and_alike(
    serializer_class: type[Serializer], body: Any
) -> None:
    serializer = serializer_class(data=body)
    valid = serializer.is_valid()
    plain = s.PLAIN_CHECKS[serializer_class](body)
    if plain is not None:
        assert valid, serializer.errors
        assert plain == dict(serializer.validated_data)
    elif not valid:
        return
    # Bodies the plain check leaves to the serializer are the unusual ones only.
    field = "question" if serializer_class is s.EnrichRequest else "answer"
    usual = isinstance(body, dict) and set(body) <= {field, "run_id"}
    if valid and usual and body.get("run_id") in (None, "run-1"):
        assert plain is not None


def test_the_plain_checks_cover_the_lane_requests() -> None:
    assert s.PLAIN_CHECKS[s.EnrichRequest]({"question": ENTRY, "run_id": "run-1"}) == {
        "question": ENTRY,
        "run_id": "run-1",
    }
    assert s.PLAIN_CHECKS[s.StoreRequest]({"answer": ENTRY}) == {"answer": ENTRY}
