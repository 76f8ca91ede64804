"""How a backend hands the contract's methods to the parts it holds.

A backend is made of parts (its conversations, summaries, checkpoints) that it creates as
objects and keeps as attributes; each method of the contract that a part serves is named
on the backend's class as ``delegate("<attribute>", Part.method)``: a reader (and a type
checker) goes from the backend straight to the part's method, and the call is resolved by
name on the part the backend holds now (a subclass may give it another part).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from importlib import import_module
from importlib.util import find_spec
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


def backend_package(package: str, name: str) -> Callable[[str], Any]:
    """A backend package's module ``__getattr__``: ``name`` (the backend's class) from the
    package's ``backend`` module, loaded at first use, so that importing one of the
    package's other modules loads no backend; any other name of ``backend`` too, with a
    DeprecationWarning (it lived at the package's path before the package had parts)."""

    def getattr_(attribute: str) -> Any:
        if attribute.startswith("__") or find_spec(f"{package}.{attribute}") is not None:
            raise AttributeError(attribute)  # a module of the package: the import system loads it
        backend = import_module(f"{package}.backend")
        if attribute == name:
            return getattr(backend, name)
        if hasattr(backend, attribute):
            warnings.warn(
                f"{package}.{attribute} moved: import it from {package}.backend.",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(backend, attribute)
        raise AttributeError(f"module {package!r} has no attribute {attribute!r}")

    return getattr_
