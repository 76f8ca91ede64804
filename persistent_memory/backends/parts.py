"""How a backend hands the contract's methods to the parts it holds.

A backend is made of parts (its conversations, summaries, checkpoints) that it creates as
objects and keeps as attributes; each method of the contract that a part serves is named
on the backend's class as ``delegate("<attribute>", Part.method)``: a reader (and a type
checker) goes from the backend straight to the part's method, and the call is resolved by
name on the part the backend holds now (a subclass may give it another part).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def delegate(part: str, method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A method that calls ``method``'s namesake on the backend's attribute ``part``, with
    ``method``'s signature and docstring."""
    name = method.__name__

    @functools.wraps(method)
    def delegated(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        return getattr(getattr(self, part), name)(*args, **kwargs)

    return delegated
