"""A DRF throttle keyed by the caller's owner, so that each owner has its own budget."""

from __future__ import annotations

from typing import Any

from rest_framework.throttling import SimpleRateThrottle

from persistent_memory.exceptions import InvalidOwner
from persistent_memory.resolvers import resolve_owner


class OwnerRateThrottle(SimpleRateThrottle):
    """Requests per owner at the rate named ``persistent_memory`` (e.g. ``"600/min"``).

    Set the rate in ``PERSISTENT_MEMORY["API_THROTTLE_RATES"]`` or the project's
    ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``. Callers without an owner share one
    budget per client address (they are refused anyway, but still count).
    """

    scope = "persistent_memory"

    def get_cache_key(self, request: Any, view: Any) -> str:
        try:
            owner = resolve_owner(request)
        except InvalidOwner:
            owner = None
        ident = f"owner:{owner}" if owner is not None else f"anon:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
