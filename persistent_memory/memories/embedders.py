"""Embedders: what turns a memory's text into the vector semantic search compares.

``EMBEDDER`` is ``"openai"`` (:class:`OpenAIEmbedder`, built from ``EMBEDDER_OPTIONS``:
the OpenAI embeddings API and every server that speaks it, such as Ollama, vLLM, LM
Studio, llama.cpp's server or LiteLLM), or the import string of a callable ``(texts) ->
vectors``. Every vector is stored with the embedder's :attr:`Embedder.model` and its
length, so vectors of another model (or size) are never compared with the query's: a
model change leaves them out of semantic search until ``memory_embed`` re-embeds them.

A request (a write, a search) never waits long for the embedder:
:func:`request_vectors` makes one try within ``EMBEDDER_REQUEST_TIMEOUT``, and only while
the :data:`circuit` is closed. ``EMBEDDER_CIRCUIT_FAILURES`` failures in a row (a timeout
counts) open it for ``EMBEDDER_CIRCUIT_SECONDS``, during which requests do not call the
embedder at all; then one call may try again (half-open) and closes it when it answers.
A write whose vector did not come is stored without one and embedded in the background
(:mod:`persistent_memory.memories.embedding_worker`, with the embedder's own timeout and
retries; ``memory_embed`` catches up with the rest); a search answers by keyword.

A vector is stored only when it has a direction (finite, not all zero) and the model's
length: ``EMBEDDER_OPTIONS["dimensions"]`` when set, else the length of the vectors of
this model already stored, and never more than ``EMBEDDER_MAX_DIMENSIONS``. Another is
refused (:func:`refusal`): the memory is stored without it and ``health.rejected``
counts it; a query vector refused so makes the search answer by keyword.
"""

from __future__ import annotations

import concurrent.futures
import copy
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


class EmbeddingTimeout(EmbeddingFailed):
    """The embedder did not answer within the time the caller gave it."""


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
        self._timeouts: tuple[type[Exception], ...] = (openai.APITimeoutError,)
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key, timeout=float(timeout), max_retries=int(max_retries)
        )

    def __repr__(self) -> str:
        return f"<OpenAIEmbedder model={self.model!r} base_url={self.base_url!r}>"

    def bounded(self, timeout: float) -> OpenAIEmbedder:
        """This embedder with one try of at most ``timeout`` seconds a request (the
        client's own timeout; no thread is left waiting), for callers that cannot wait."""
        clone = copy.copy(self)
        clone.client = self.client.with_options(timeout=float(timeout), max_retries=0)
        return clone

    def __call__(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        extra = {"dimensions": self.dimensions} if self.dimensions is not None else {}
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            try:
                answer = self.client.embeddings.create(
                    model=self.model, input=batch, encoding_format="float", **extra
                )
            except self._timeouts as exc:
                raise EmbeddingTimeout(f"{type(exc).__name__}: {exc}") from exc
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
    _bounded: dict[float, Callable[[list[str]], Sequence[Sequence[float]]]] = field(
        default_factory=dict, repr=False
    )

    def embed(self, texts: list[str], *, timeout: float | None = None) -> list[list[float]]:
        """One list of numbers per text (each to be :func:`checked` before it is stored or
        searched with); :class:`EmbeddingFailed` otherwise (whatever the callable raised).

        With ``timeout``: one try, and :class:`EmbeddingTimeout` when no answer came
        within it (the ``"openai"`` embedder's client times out itself; a custom callable
        runs on a small pool of threads and is left to finish there)."""
        try:
            raw = self.function(texts) if timeout is None else self._within(texts, timeout)
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
        # A vector that is empty, not finite or of another length fails no other text's:
        # :func:`checked` refuses it alone.
        return vectors

    def _within(self, texts: list[str], timeout: float) -> Sequence[Sequence[float]]:
        bounded = getattr(self.function, "bounded", None)
        if callable(bounded):
            if timeout not in self._bounded:
                self._bounded[timeout] = bounded(timeout)
            return self._bounded[timeout](texts)
        future = _pool().submit(self.function, texts)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # not started yet (the pool busy with hung calls): never runs
            raise EmbeddingTimeout(f"no answer within {timeout:g} seconds") from None


_executor: list[concurrent.futures.ThreadPoolExecutor] = []
_executor_lock = threading.Lock()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads a custom embedder's bounded calls run on: a few, so that an embedder
    that hangs holds at most these (the circuit then stops calling it)."""
    with _executor_lock:
        if not _executor:
            _executor.append(
                concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="persistent-memory-embed"
                )
            )
        return _executor[0]


@dataclass
class EmbedderHealth:
    """This process's embedding outcomes since it started (shown by ``health/``)."""

    failures: int = 0
    embedded: int = 0
    #: Vectors answered but not stored or compared: no direction, or not the model's length.
    rejected: int = 0
    #: Requests that did not call the embedder because the circuit was open.
    skipped: int = 0
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

    def refused(self, reason: str) -> None:
        with self.lock:
            self.rejected += 1
            self.last_error, self.last_error_at = f"vector refused: {reason}"[:500], time.time()

    def skip(self) -> None:
        with self.lock:
            self.skipped += 1


CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class Circuit:
    """Whether requests may call the embedder (see the module's docstring): closed, open
    until ``retry_at`` after ``threshold`` failures in a row, then half-open for one call
    (the first to ask) whose outcome closes or opens it again. This process's alone."""

    def __init__(
        self, *, threshold: int = 3, cooldown: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold, self.cooldown, self.clock = threshold, cooldown, clock
        self.state = CLOSED
        #: Failures in a row (reset by a success).
        self.failures = 0
        self.opened_at: float | None = None
        self._retry_at = 0.0  # self.clock() after which one call may try
        self._lock = threading.Lock()

    def allow(self) -> bool:
        """Whether the caller may call the embedder now; in half-open, only the first to
        ask (and another once a cool-down passed without its outcome)."""
        with self._lock:
            if self.state == CLOSED:
                return True
            now = self.clock()
            if now < self._retry_at:
                return False
            self.state, self._retry_at = HALF_OPEN, now + self.cooldown
            return True

    def wait_seconds(self) -> float:
        """Seconds before a call may try again (0: now)."""
        with self._lock:
            return 0.0 if self.state == CLOSED else max(0.0, self._retry_at - self.clock())

    def retry_at(self) -> float | None:
        """When a call may try again (epoch seconds; None while closed)."""
        with self._lock:
            if self.state == CLOSED:
                return None
            return time.time() + max(0.0, self._retry_at - self.clock())

    def succeeded(self) -> None:
        with self._lock:
            self.state, self.failures, self.opened_at = CLOSED, 0, None

    def failed(self, *, decisive: bool = False) -> None:
        """One more failure; ``decisive`` (a call that used the full timeout and retries)
        opens it at once, as does a failed half-open try."""
        with self._lock:
            self.failures += 1
            if decisive or self.state == HALF_OPEN or self.failures >= self.threshold:
                if self.state == CLOSED:
                    self.opened_at = time.time()
                self.state, self._retry_at = OPEN, self.clock() + self.cooldown


health = EmbedderHealth()
_current: list[Embedder | None] = []
_circuit: list[Circuit] = []
#: The vector length of each model as first found stored ((database alias, model) -> length).
_lengths: dict[tuple[str, str], int] = {}


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


def circuit() -> Circuit:
    """This process's circuit (a new one, closed, at each settings change)."""
    if not _circuit:
        _circuit.append(
            Circuit(
                threshold=memory_settings.EMBEDDER_CIRCUIT_FAILURES,
                cooldown=float(memory_settings.EMBEDDER_CIRCUIT_SECONDS),
            )
        )
    return _circuit[0]


def expected_length(model: str) -> int | None:
    """The length a vector of ``model`` must have: ``EMBEDDER_OPTIONS["dimensions"]``
    when set, else that of the vectors of this model already stored (the first one
    found; None while there is none)."""
    dimensions = (memory_settings.EMBEDDER_OPTIONS or {}).get("dimensions")
    if isinstance(dimensions, int) and not isinstance(dimensions, bool) and dimensions > 0:
        return dimensions
    from django.db import router

    from persistent_memory.models import LongTermMemory

    key = (router.db_for_read(LongTermMemory), model)
    if key not in _lengths:
        stored = (
            LongTermMemory.objects.using(key[0])
            .filter(embedding_model=model, embedding_dimensions__isnull=False)
            .order_by("pk")
            .values_list("embedding_dimensions", flat=True)
            .first()
        )
        if stored is None:
            return None  # not remembered: the first vector stored sets it
        _lengths[key] = int(stored)
    return _lengths[key]


def refusal(vector: Sequence[float], model: str) -> str | None:
    """Why ``vector`` (of ``model``) may be neither stored nor searched with, or None:
    longer than ``EMBEDDER_MAX_DIMENSIONS``, not the model's length (:func:`expected_length`),
    not finite, or all zero (no direction: every cosine with it is undefined)."""
    cap = memory_settings.EMBEDDER_MAX_DIMENSIONS
    if not vector:
        return "empty"
    if len(vector) > cap:
        return f"{len(vector)} dimensions, more than EMBEDDER_MAX_DIMENSIONS ({cap})"
    if not all(math.isfinite(x) for x in vector):
        return "not finite"
    if not any(vector):
        return "all zero (no direction)"
    expected = expected_length(model)
    if expected is not None and len(vector) != expected:
        return f"{len(vector)} dimensions, where this model's vectors have {expected}"
    return None


def checked(vectors: list[list[float]], model: str) -> list[list[float] | None]:
    """``vectors`` with each refused one (see :func:`refusal`) None, counted and logged."""
    kept: list[list[float] | None] = []
    for vector in vectors:
        reason = refusal(vector, model)
        if reason is not None:
            health.refused(reason)
            logger.warning("A vector of model %r was refused (not stored nor searched): %s", model, reason)
        kept.append(None if reason else vector)
    return kept


def embed_or_none(
    texts: list[str], *, embedder: Embedder | None = None, gate: Circuit | None = None
) -> list[list[float]] | None:
    """The texts' vectors with the embedder's own timeout and retries (``memory_embed``
    and the background worker), or None without an embedder or when it failed (the
    failure is logged and counted in :data:`health`, and opens the circuit; nothing is
    raised). It does not ask the circuit: it is what tries again. ``embedder`` and
    ``gate``: the worker's own (those of the settings it was started with)."""
    embedder = embedder or current()
    if embedder is None or not texts:
        return None
    gate = gate or circuit()
    try:
        vectors = embedder.embed(texts)
    except EmbeddingFailed as exc:
        health.failed(str(exc))
        gate.failed(decisive=True)
        logger.warning(
            "Embedding %d texts failed (stored without vectors; memory_embed retries): %s", len(texts), exc
        )
        return None
    health.succeeded(len(vectors))
    gate.succeeded()
    return vectors


def request_vectors(texts: list[str]) -> list[list[float]] | None:
    """The texts' vectors for a request that cannot wait: None without an embedder, while
    the circuit is open, or when one try within ``EMBEDDER_REQUEST_TIMEOUT`` (and the
    embedder's own timeout, if shorter) failed. Outcomes are counted in :data:`health`
    and move the circuit; nothing is raised."""
    embedder = current()
    if embedder is None or not texts:
        return None
    gate = circuit()
    if not gate.allow():
        health.skip()
        return None
    timeout = float(memory_settings.EMBEDDER_REQUEST_TIMEOUT)
    own = (memory_settings.EMBEDDER_OPTIONS or {}).get("timeout")
    if isinstance(own, int | float) and not isinstance(own, bool) and 0 < own < timeout:
        timeout = float(own)
    try:
        vectors = embedder.embed(texts, timeout=timeout)
    except EmbeddingFailed as exc:
        health.failed(str(exc))
        gate.failed()
        logger.warning("Embedding %d texts in a request failed (circuit %s): %s", len(texts), gate.state, exc)
        return None
    health.succeeded(len(vectors))
    gate.succeeded()
    return vectors


@receiver(setting_changed)
def _forget_embedder(*, setting: str, **kwargs: Any) -> None:
    if setting in RELOADED_BY:
        _current.clear()
        _circuit.clear()
        _lengths.clear()
