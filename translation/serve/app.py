"""The HTTP side of the server: a Starlette application over a :class:`ServedModel` and its
:class:`Batcher`.

Routes:

* ``POST /translate``: ``{"lines": [...], ...options}`` -> ``{"translations": [...]}``, one
  string per line, in order (``requests.py`` has the fields); with ``nbest`` > 1 also
  ``"nbest"``: per line its hypotheses, best first, as ``{"text", "score"}`` (an empty line has
  none). Errors are JSON, ``{"error": ..., "field": ...}``: 400 for a request that is wrong,
  naming its field; 413 for a body over the limit; 503 (with ``Retry-After``) when the queue is
  over its bound or the server is stopping; 500 when the search itself failed.
* ``GET /``: the page to type into (``page.html``, everything inline).
* ``GET /health``: ``{"status": "ok", ...}`` with the model's languages, the lines waiting and
  what the decoder has done (requests, lines, searches, refused).

The lines are tokenized here, in the event loop (SentencePiece takes microseconds a line), and
searched by the batcher's one decoding thread; the handler awaits its future, so the loop keeps
answering (the page, ``/health``, 503s) while a search runs.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from decoding import DecodingConfig
from translation.outputs import best_lines
from translation.results import Translation
from translation.serve.batcher import Batcher, QueueFullError
from translation.serve.model import SearchKey, ServedModel
from translation.serve.requests import RequestError, RequestLimits, parse_request

logger = logging.getLogger(__name__)

# A body over the limit is read (and dropped) up to this many times the limit (_read_body).
DRAINED = 8
PAGE = files("translation.serve").joinpath("page.html").read_text(encoding="utf-8")


def _error(status: int, message: str, field: str | None = None, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers or None)


def _hypothesis(h: Translation) -> dict[str, Any]:
    """One n-best entry; greedy search's NaN score is null (JSON has no NaN)."""
    return {"text": h.text, "score": None if math.isnan(h.score) else round(h.score, 6)}


def _response(results: list[list[Translation]], options: DecodingConfig) -> dict[str, Any]:
    body: dict[str, Any] = {"translations": best_lines(results, options.sampling)}
    if options.nbest > 1:
        body["nbest"] = [[_hypothesis(h) for h in hyps] for hyps in results]
    return body


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 past ``limit`` bytes.

    A body over the limit is still read, and dropped, up to :data:`DRAINED` times the limit, so
    that its client, still sending, gets the 413 rather than a broken connection; past that
    the connection is dropped unread.
    """
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > DRAINED * limit:
            break
    if size > limit:
        raise RequestError(f"the body has over the {limit} bytes a request may have", status=413)
    return b"".join(chunks)


def build_app(
    model: ServedModel,
    batcher: Batcher,
    defaults: DecodingConfig,
    limits: RequestLimits,
    on_start: Callable[[], None] | None = None,
) -> Starlette:
    """The application; its lifespan starts the batcher's thread and, at shutdown (after the
    requests in flight are answered), lets it finish and stops it.

    Args:
        model: what translates.
        batcher: the queue over ``model.decode``.
        defaults: the search settings of a request that sets none.
        limits: what one request may ask for.
        on_start: called once the decoder runs (the command line says where it listens).
    """

    async def translate(request: Request) -> Response:
        try:
            body = await _read_body(request, limits.max_body_bytes)
            req = parse_request(body, defaults, limits)
            lang = model.language(req.target_lang)
            sources = model.encode(req.lines, lang) if req.lines else []
        except RequestError as err:
            return JSONResponse(err.body(), status_code=err.status)
        if not sources:
            return JSONResponse(_response([], req.options))
        try:
            future = batcher.submit(SearchKey(req.options, lang), sources)
        except QueueFullError as err:
            return _error(503, str(err), None, **{"Retry-After": "1"})
        try:
            results = await asyncio.wrap_future(future)
        except Exception as err:  # the search failed (logged by the batcher)
            return _error(500, f"the search failed: {type(err).__name__}: {err}")
        return JSONResponse(_response(results, req.options))

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE)

    async def health(request: Request) -> Response:
        return JSONResponse(_health(model, batcher, defaults))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, str(exc.detail))

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/translate", translate, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    lifespan = _lifespan(batcher, on_start)
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)


def _health(model: ServedModel, batcher: Batcher, defaults: DecodingConfig) -> dict:
    """``GET /health``: the languages, the defaults, the queue and the counts so far."""
    counters = batcher.counters
    return {
        "status": "ok",
        "source_lang": model.src_lang,
        "target_langs": model.languages,
        "default_target_lang": model.default_lang,
        "defaults": {"beam_size": defaults.beam_size, "greedy": defaults.greedy, "alpha": defaults.alpha},
        "queued_lines": batcher.queued_lines,
        "requests": counters.requests,
        "lines": counters.lines,
        "searches": counters.searches,
        "refused": counters.refused,
    }


def _lifespan(batcher: Batcher, on_start: Callable[[], None] | None) -> Callable[[Starlette], Any]:
    """Starts the batcher's thread with the application; at shutdown, after the requests in flight
    are answered, lets it finish what is queued, stops it and logs the totals."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        batcher.start()
        if on_start is not None:
            on_start()
        yield
        await asyncio.to_thread(batcher.close)
        counters = batcher.counters
        logger.info(
            "stopped: %d requests, %d lines in %d searches; %d refused",
            counters.requests,
            counters.lines,
            counters.searches,
            counters.refused,
        )

    return lifespan
