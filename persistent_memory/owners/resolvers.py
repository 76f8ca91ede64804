"""Owner resolvers: who a request's memory belongs to, decided on the server.

``PERSISTENT_MEMORY["OWNER_RESOLVER"]`` names a callable ``(request) -> str | None``.
It returns an owner string (see :mod:`persistent_memory.owners` for the characters
allowed) or None, which refuses the request with 403 ``owner_required``: the API
never takes an owner from the request body, and without one it fails closed.
"""

from __future__ import annotations

import functools
from typing import Any

from django.utils.module_loading import import_string

from persistent_memory.conf import memory_settings
from persistent_memory.owners import UNOWNED, validate_owner


def user_owner(request: Any) -> str | None:
    """``user:<pk>`` for an authenticated user (the default); None otherwise."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return f"user:{user.pk}"


def shared_owner(request: Any) -> str:
    """One namespace for every caller: the unowned sessions, as before owners existed.

    Every caller can read and change every other caller's sessions, and the sessions
    the original node writes to the same Redis. Choose it only where all callers are
    one party (a single pipeline service); ``check --deploy`` warns about it.
    """
    return UNOWNED


def tenant_user_owner(request: Any) -> str | None:
    """``tenant:<t>/user:<pk>`` from ``request.tenant`` (set by a tenancy middleware).

    An example for multi-tenant projects: the tenant is a string, or an object with
    ``slug``, ``schema_name`` (django-tenants) or ``pk``. No tenant or no
    authenticated user: None (refused).
    """
    user = user_owner(request)
    tenant = getattr(request, "tenant", None)
    if not isinstance(tenant, str) and tenant is not None:
        for attribute in ("slug", "schema_name", "pk"):
            name = getattr(tenant, attribute, None)
            if name not in (None, ""):
                tenant = str(name)
                break
        else:
            tenant = None
    if user is None or not tenant:
        return None
    return f"tenant:{tenant}/{user}"


@functools.lru_cache(maxsize=16)
def _resolver(path: str) -> Any:
    # Imported once per path, not per request; a changed setting names another path.
    return import_string(path)


def resolve_owner(request: Any) -> str | None:
    """The owner ``OWNER_RESOLVER`` gives this request (validated), or None."""
    owner = _resolver(memory_settings.OWNER_RESOLVER)(request)
    return None if owner is None else validate_owner(owner)
