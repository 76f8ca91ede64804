"""Token counts of chat messages, counted once when a message is appended.

``TOKENIZER`` names the counter: ``"o200k_base"`` (the default) and ``"cl100k_base"``
count exactly as OpenAI's tokenizers do, with ``tiktoken`` reading the encodings that
ship with this app (``encodings/``), never the network; ``"chars"`` estimates four
characters a token; anything else is an import string of a callable ``(text) -> int``.

A message costs what OpenAI's chat format adds around it as well as its text:

* 3 tokens for every message (its role and the separators around it);
* the content's tokens (content parts: a text part's text; an image part 85, the cost
  of a low-detail image; any other part the tokens of its JSON);
* with a ``name``: its tokens plus 1;
* for each tool call: the tokens of its function's name and arguments, plus 3.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

#: What OpenAI's chat format adds per message, per name, per tool call and per image part.
MESSAGE_OVERHEAD = 3
NAME_OVERHEAD = 1
TOOL_CALL_OVERHEAD = 3
IMAGE_PART_TOKENS = 85

#: Encodings counted by tiktoken from the files in ``encodings/``.
TIKTOKEN_ENCODINGS = ("o200k_base", "cl100k_base")

_load_lock = threading.Lock()


def _tiktoken_counter(name: str) -> Callable[[str], int]:
    import tiktoken

    # tiktoken looks for an encoding's file in TIKTOKEN_CACHE_DIR under the name it
    # caches it by, and checks its hash, before it would download it: point it at the
    # files shipped here for the one call that loads it (it keeps the encoding).
    directory = str(resources.files("persistent_memory.chat").joinpath("encodings"))
    with _load_lock:
        previous = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = directory
        try:
            encoding = tiktoken.get_encoding(name)
        finally:
            if previous is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = previous
    encode = encoding.encode_ordinary  # special tokens in user text are text, not control tokens
    return lambda text: len(encode(text))


def _chars(text: str) -> int:
    """About four characters a token, rounded up."""
    return (len(text) + 3) // 4


@lru_cache(maxsize=8)
def text_counter(name: str) -> Callable[[str], int]:
    """The function counting the tokens of a text for tokenizer ``name``."""
    if name in TIKTOKEN_ENCODINGS:
        return _tiktoken_counter(name)
    if name == "chars":
        return _chars
    try:
        counter = import_string(name)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"PERSISTENT_MEMORY: TOKENIZER {name!r} cannot be imported: {exc}"
        ) from exc
    if not callable(counter):
        raise ImproperlyConfigured(f"PERSISTENT_MEMORY: TOKENIZER {name!r} is not callable.")
    return counter


def _content_tokens(content: Any, count: Callable[[str], int]) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return count(content)
    total = 0
    for part in content:
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            total += count(part["text"])
        elif kind in ("image_url", "input_image", "image"):
            total += IMAGE_PART_TOKENS
        else:
            total += count(json.dumps(part))
    return total


def message_tokens(message: dict[str, Any], tokenizer: str) -> int:
    """Tokens of one (valid) chat message, overhead included (see the module's docstring)."""
    count = text_counter(tokenizer)
    total = MESSAGE_OVERHEAD + _content_tokens(message.get("content"), count)
    if message.get("name"):
        total += NAME_OVERHEAD + count(message["name"])
    for call in message.get("tool_calls") or ():
        function = call["function"]
        total += TOOL_CALL_OVERHEAD + count(function["name"]) + count(function["arguments"])
    return total
