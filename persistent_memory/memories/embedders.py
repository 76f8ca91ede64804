"""Embedders: what turns a memory's text into the vector semantic search compares.

``EMBEDDER`` is ``"openai"`` (:class:`OpenAIEmbedder`, built from ``EMBEDDER_OPTIONS``:
the OpenAI embeddings API and every server that speaks it, such as Ollama, vLLM, LM
Studio, llama.cpp's server or LiteLLM), or the import string of a callable ``(texts) ->
vectors``. Every vector is stored with the embedder's :attr:`Embedder.model` and its
length, so vectors of another model (or size) are never compared with the query's: a
model change leaves them out of semantic search until ``memory_embed`` re-embeds them.

An embedder that fails never fails a write: :func:`embed_or_none` records the failure
(see :data:`health`) and the memory is stored without a vector, for ``memory_embed``
to embed later; meanwhile search finds it by keyword.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from persistent_memory.conf import RELOADED_BY, memory_settings

logger = logging.getLogger("persistent_memory.memories")

#: EMBEDDER_OPTIONS keys :class:`OpenAIEmbedder` takes.
OPENAI_OPTIONS = ("model", "base_url", "dimensions", "api_key_env", "timeout", "batch_size", "max_retries")


class EmbeddingFailed(Exception):
    """The embedder raised, timed out, or answered something that is not one vector per text."""


class OpenAIEmbedder:
    """``POST {base_url}/embeddings`` through the official ``openai`` client.

    ``model`` (default ``text-embedding-3-small``), ``base_url`` (None: the client's
    default, ``OPENAI_BASE_URL`` or OpenAI's; ``http://localhost:11434/v1`` for Ollama),
    ``dimensions`` (sent only when set: models that can shorten their vectors),
    ``api_key_env`` (the *name* of the variable holding the key; None for servers that want
    none), ``timeout`` (seconds per request), ``batch_size`` (texts per request),
    ``max_retries`` (the client retries connection errors, timeouts, 408, 409, 429 and 5xx
    answers with exponential backoff). The key is read when the embedder is built and is
    never logged nor shown in its ``repr``.
    """

    def __init__(
        self,
        *,
        model: str = "text-embedding-3-small",
        base_url: str | None = None,
        dimensions: int | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout: float = 10.0,
        batch_size: int = 64,
        max_retries: int = 2,
    ) -> None:
        try:
            import openai
        except ImportError as exc:
            raise ImproperlyConfigured(
                'PERSISTENT_MEMORY: EMBEDDER "openai" needs the openai package: '
                'pip install "django-persistent-memory[openai]"'
            ) from exc
        if not isinstance(model, str) or not model:
            raise ImproperlyConfigured("PERSISTENT_MEMORY: EMBEDDER_OPTIONS['model'] must name a model.")
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise ImproperlyConfigured(
                "PERSISTENT_MEMORY: EMBEDDER_OPTIONS['dimensions'] must be a positive integer."
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ImproperlyConfigured(
                "PERSISTENT_MEMORY: EMBEDDER_OPTIONS['batch_size'] must be a positive integer."
            )
        # A missing key is not an error here: a local server wants none, and OpenAI's
        # answer (401) is then an embedding failure that health/ shows.
        api_key = (os.environ.get(api_key_env, "") if api_key_env else "") or "unused"
        self.model = model
        self.base_url = base_url
        self.dimensions = dimensions
        self.batch_size = batch_size
        self._errors: tuple[type[Exception], ...] = (openai.OpenAIError,)
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key, timeout=float(timeout), max_retries=int(max_retries)
        )

    def __repr__(self) -> str:
        return f"<OpenAIEmbedder model={self.model!r} base_url={self.base_url!r}>"

    def __call__(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        extra = {"dimensions": self.dimensions} if self.dimensions is not None else {}
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            try:
                answer = self.client.embeddings.create(
                    model=self.model, input=batch, encoding_format="float", **extra
                )
            except self._errors as exc:
                raise EmbeddingFailed(f"{type(exc).__name__}: {exc}") from exc
            # The API answers each vector with the index of its text: put them in order.
            vectors.extend(item.embedding for item in sorted(answer.data, key=lambda item: item.index))
        return vectors


@dataclass
class Embedder:
    """The configured embedder: the callable and the model name stored with its vectors."""

    function: Callable[[list[str]], Sequence[Sequence[float]]]
    model: str

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, each finite and non-empty and all of one length;
        :class:`EmbeddingFailed` otherwise (whatever the callable raised)."""
        try:
            raw = self.function(texts)
        except EmbeddingFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - a custom embedder may raise anything
            raise EmbeddingFailed(f"{type(exc).__name__}: {exc}") from exc
        try:
            vectors = [[float(x) for x in vector] for vector in raw]
        except (TypeError, ValueError) as exc:
            raise EmbeddingFailed(f"the embedder answered something that is not vectors: {exc}") from exc
        if len(vectors) != len(texts):
            raise EmbeddingFailed(f"the embedder answered {len(vectors)} vectors for {len(texts)} texts")
        sizes = {len(vector) for vector in vectors}
        if 0 in sizes or len(sizes) > 1 or not all(math.isfinite(x) for vector in vectors for x in vector):
            raise EmbeddingFailed("the embedder answered empty, unequal or non-finite vectors")
        return vectors


@dataclass
class EmbedderHealth:
    """This process's embedding outcomes since it started (shown by ``health/``)."""

    failures: int = 0
    embedded: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    last_success_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def failed(self, error: str) -> None:
        with self.lock:
            self.failures += 1
            self.last_error, self.last_error_at = error[:500], time.time()

    def succeeded(self, count: int) -> None:
        with self.lock:
            self.embedded += count
            self.last_success_at = time.time()


health = EmbedderHealth()
_current: list[Embedder | None] = []


def build(path: Any, options: dict[str, Any]) -> Embedder | None:
    """The embedder that ``EMBEDDER`` and ``EMBEDDER_OPTIONS`` name (None: none)."""
    if not path:
        return None
    if path == "openai":
        unknown = sorted(set(options) - set(OPENAI_OPTIONS))
        if unknown:
            raise ImproperlyConfigured(
                f"PERSISTENT_MEMORY: EMBEDDER_OPTIONS has unknown keys {unknown}; "
                f"use {', '.join(OPENAI_OPTIONS)}."
            )
        function = OpenAIEmbedder(**options)
        return Embedder(function, function.model)
    try:
        function = import_string(path) if isinstance(path, str) else path
    except ImportError as exc:
        raise ImproperlyConfigured(f"PERSISTENT_MEMORY: EMBEDDER {path!r} cannot be imported: {exc}") from exc
    if not callable(function):
        raise ImproperlyConfigured(f"PERSISTENT_MEMORY: EMBEDDER {path!r} is not callable.")
    return Embedder(function, model_name(path, options))


def model_name(path: Any, options: dict[str, Any]) -> str:
    """The model name ``EMBEDDER`` stores with its vectors, without building it: the
    ``"openai"`` embedder's model; a custom embedder's ``model`` attribute, else its
    import string (the same in every process)."""
    if path == "openai":
        return str(options.get("model") or "text-embedding-3-small")
    try:
        function = import_string(path) if isinstance(path, str) else path
    except ImportError:
        function = None
    model = getattr(function, "model", None)
    if isinstance(model, str) and model:
        return model
    return (
        path
        if isinstance(path, str)
        else f"{path.__module__}.{getattr(path, '__qualname__', type(path).__name__)}"
    )


def current() -> Embedder | None:
    """The configured embedder (built once per settings change), or None."""
    if not _current:
        _current.append(build(memory_settings.EMBEDDER, dict(memory_settings.EMBEDDER_OPTIONS or {})))
    return _current[0]


def embed_or_none(texts: list[str]) -> list[list[float]] | None:
    """The texts' vectors, or None without an embedder or when it failed (the failure is
    logged and counted in :data:`health`; nothing is raised)."""
    embedder = current()
    if embedder is None or not texts:
        return None
    try:
        vectors = embedder.embed(texts)
    except EmbeddingFailed as exc:
        health.failed(str(exc))
        logger.warning(
            "Embedding %d texts failed (stored without vectors; memory_embed retries): %s", len(texts), exc
        )
        return None
    health.succeeded(len(vectors))
    return vectors


@receiver(setting_changed)
def _forget_embedder(*, setting: str, **kwargs: Any) -> None:
    if setting in RELOADED_BY:
        _current.clear()
