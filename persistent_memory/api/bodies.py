"""Request bodies sent without a Content-Length (``Transfer-Encoding: chunked``).

Django reads ``CONTENT_LENGTH`` bytes of a request and nothing else, so such a body
reads as empty and a valid request would answer 400 "field required". Whether it can
be read depends on the server:

- gunicorn (and uWSGI, mod_wsgi) decode the chunks and end ``wsgi.input`` at the end
  of the body, which they announce with ``wsgi.input_terminated``; an ASGI server
  hands Django the whole body. There the body is read like any other.
- runserver (wsgiref) passes the raw chunked stream on and cannot tell where it
  ends: there the request is refused with 411 ``length_required``, never read as empty.
  (runserver then reads the unread chunks as the connection's next request and
  answers them with its own 400: a limit of the development server.)

A body whose chunks the server cannot decode (a chunk size that is not hexadecimal, a
missing terminator, a connection closed mid-body) is the caller's error: 400
``malformed_body``. gunicorn raises its own parse errors from ``wsgi.input`` then;
uvicorn answers such a request itself, before the application sees it.
"""

from __future__ import annotations

import io
import logging

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest

from persistent_memory.api.errors import LengthRequired, MalformedBody, PayloadTooLarge

logger = logging.getLogger("persistent_memory.api")


def read_unsized_body(request: HttpRequest, *, limit: int) -> None:
    """Give a body sent without a length its length, or refuse it.

    Reads at most ``limit`` bytes (over that: 413); afterwards the request reads as if
    it had come with a ``Content-Length``.
    """
    meta = request.META
    if meta.get("CONTENT_LENGTH") or not meta.get("HTTP_TRANSFER_ENCODING"):
        return
    if isinstance(request, ASGIRequest):
        source = request._stream  # the body the ASGI server delivered, whole
    elif meta.get("wsgi.input_terminated"):
        source = meta["wsgi.input"]  # decoded by the server, ends with the body
    else:
        raise LengthRequired()
    try:
        body = source.read(limit + 1)
    except Exception as exc:  # each server raises its own (gunicorn: InvalidChunkSize, NoMoreData...)
        logger.info("persistent_memory: unreadable chunked body of %s: %r", request.path, exc)
        raise MalformedBody() from exc
    if len(body) > limit:
        raise PayloadTooLarge(f"The request body is over {limit} bytes.")
    # What HttpRequest.body does once it has read a body: serve it from memory.
    request._stream = io.BytesIO(body)
    meta["CONTENT_LENGTH"] = str(len(body))
