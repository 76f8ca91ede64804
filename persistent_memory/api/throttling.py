"""A DRF throttle keyed by the caller's owner, so that each owner has its own budget."""

from __future__ import annotations

from typing import Any

from rest_framework.throttling import SimpleRateThrottle

from persistent_memory.exceptions import InvalidOwner
from persistent_memory.owners.resolvers import resolve_owner


class OwnerRateThrottle(SimpleRateThrottle):
    """Requests per owner at the rate named ``persistent_memory`` (e.g. ``"600/min"``).

    Set the rate in ``PERSISTENT_MEMORY["API_THROTTLE_RATES"]`` or the project's
    ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``. Callers without an owner, or in the
    one shared namespace, have a budget per user, else per client address.
    """

    scope = "persistent_memory"

    def get_cache_key(self, request: Any, view: Any) -> str:
        try:
            owner = resolve_owner(request)
        except InvalidOwner:
            owner = None
        if owner:
            ident = f"owner:{owner}"
        else:  # no owner, or the one shared namespace: per user, else per client address
            user = getattr(request, "user", None)
            authenticated = user is not None and user.is_authenticated
            ident = f"user:{user.pk}" if authenticated else f"anon:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
