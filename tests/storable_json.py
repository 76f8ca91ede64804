"""Hypothesis strategies for JSON any store and database keeps as it is: what an owner
may write through the REST API as a value or as metadata (no NaN, no U+0000, no lone
surrogates: those are refused before anything is written)."""

from __future__ import annotations

from hypothesis import strategies as st

TEXTS = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=6)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXTS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXTS, inner, max_size=3),
    max_leaves=8,
)
