"""Examples for the OpenAPI schema: request bodies and path parameters that work as they
are when sent from the docs page (Swagger UI fills them in on "Try it out").

``tests/test_api_examples.py`` sends every request example the schema holds, with the
path and header parameters' examples, in the order a person trying the API would: writes
first (shortest path first: a resource before what is inside it), then reads, then
deletes (longest path first, so forgetting the owner, ``owner/``, comes last), and
expects a 2xx for each. So examples of one resource use the same ids (the session
``chat-42``, its key ``topic``, the memory 1 that the create example makes in a fresh
database), a write's example leaves what a later read needs, and each endpoint's path
parameters carry an example.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter

#: The session the examples work on (the questions lane's example creates it).
SESSION = "chat-42"


def path_parameter(name: str, example: str, description: str) -> OpenApiParameter:
    """A path parameter with the example the docs page fills in."""
    return OpenApiParameter(
        name,
        str,
        location=OpenApiParameter.PATH,
        description=description,
        examples=[OpenApiExample(example, value=example)],
    )


def request_example(name: str, value: Any, *, description: str = "") -> OpenApiExample:
    """A request body to send as it is."""
    return OpenApiExample(name, value=value, request_only=True, description=description)


SESSION_ID = path_parameter("session_id", SESSION, "1-128 of letters, digits, '_' and '-'.")
KEY = path_parameter("key", "topic", "1-256 of letters, digits, '_', '.' and '-'.")
#: A counter: `increment` needs a key that holds an integer (or none yet).
COUNTER_KEY = path_parameter("key", "turns", "1-256 of letters, digits, '_', '.' and '-'.")

QUESTION = {"text": "Where is the Louvre?", "metadata": {"session_id": SESSION}}
