"""What a ``POST /translate`` body may hold, checked field by field.

The body is one JSON object::

    {"lines": ["Ein Hund rennt.", ""], "beam_size": 4, "nbest": 2, "target_lang": "fr"}

``lines`` (required) is a list of strings, one translation each; ``target_lang`` (a string)
chooses the language of a model of several; every other key is a field of
:class:`decoding.DecodingConfig` whose default is a number or a boolean (``beam_size``,
``greedy``, ``nbest``, ``alpha``, ``max_len_a``, ``max_len_b``, ``min_len``,
``no_repeat_ngram``, ``sampling``, ``topk``, ``topp``, ``temperature``, ``seed``), over the
server's defaults. Anything else is a :class:`RequestError` that names the field at fault
(``lines[3]``, ``beam_size``) and becomes a 400 response, so that a client learns what to fix
without reading the server's log.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from decoding import DecodingConfig


class RequestError(Exception):
    """A request the server refuses: ``message`` for a person, ``field`` the JSON path at fault
    (``"lines[3]"``; None: the body as a whole), ``status`` the HTTP status (400, 413)."""

    def __init__(self, message: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status

    def body(self) -> dict[str, Any]:
        """The response's JSON: ``{"error": ..., "field": ...}``."""
        return {"error": str(self), "field": self.field}


def _option_types() -> dict[str, type]:
    """The :class:`DecodingConfig` fields a request may set, with their JSON type: those whose
    default is a bool, an int or a float (a field of another kind is the server's alone)."""
    found = {}
    for f in fields(DecodingConfig):
        if isinstance(f.default, bool | int | float):
            found[f.name] = type(f.default)
    return found


OPTION_TYPES = _option_types()
_JSON_TYPE = {bool: "true or false", int: "an integer", float: "a number"}


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for.

    Attributes:
        max_lines: lines in one request (more: 400 naming ``lines``).
        max_body_bytes: bytes of one body (more: 413).
        max_beam_size: ``beam_size``, and ``nbest`` (samples with ``sampling``), at most this.
    """

    max_lines: int = 1000
    max_body_bytes: int = 1 << 20
    max_beam_size: int = 16


@dataclass(frozen=True)
class TranslationRequest:
    """A checked request.

    Attributes:
        lines: ``n`` texts, each translated on its own.
        options: the search, the server's defaults with the request's fields over them.
        target_lang: the language asked for, or None (the server's default).
    """

    lines: list[str]
    options: DecodingConfig
    target_lang: str | None


def _lines(value: Any, limits: RequestLimits) -> list[str]:
    if not isinstance(value, list):
        raise RequestError(f"lines must be a list of strings, not {_kind(value)}", "lines")
    if len(value) > limits.max_lines:
        raise RequestError(
            f"{len(value)} lines: at most {limits.max_lines} in one request; send them in several",
            "lines",
        )
    for i, line in enumerate(value):
        if not isinstance(line, str):
            raise RequestError(f"each line must be a string, not {_kind(line)}", f"lines[{i}]")
    return value


def _option(name: str, value: Any) -> bool | int | float:
    wanted = OPTION_TYPES[name]
    # JSON's true is a Python bool, which is an int: a number field refuses it, as 1 for a flag.
    if wanted is bool:
        ok = isinstance(value, bool)
    elif wanted is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        raise RequestError(f"{name} must be {_JSON_TYPE[wanted]}, not {_kind(value)}", name)
    return float(value) if wanted is float else value


def _kind(value: Any) -> str:
    """A JSON value's kind, for messages: 'a string', 'null', 'the number 2.5'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value}"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _field_named(message: str, given: set[str]) -> str | None:
    """The field :class:`DecodingConfig`'s message is about: the first field name it mentions,
    one the request gave if there is one (``nbest=3 must be between 1 and the beam size``)."""
    named = [w for w in re.findall(r"[a-z_]+", message) if w in OPTION_TYPES]
    return next((w for w in named if w in given), named[0] if named else None)


def parse_request(body: bytes, defaults: DecodingConfig, limits: RequestLimits) -> TranslationRequest:
    """The request in ``body``, checked.

    Args:
        body: the raw body (UTF-8 JSON).
        defaults: the server's search settings, which the request's fields override.
        limits: what one request may ask for.

    Raises:
        RequestError: the first thing wrong, with the field it is about.
    """
    if len(body) > limits.max_body_bytes:
        raise RequestError(
            f"the body has {len(body)} bytes, over the {limits.max_body_bytes} a request may have", status=413
        )
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as err:
        raise RequestError(f"the body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise RequestError(f'the body must be a JSON object such as {{"lines": [...]}}, not {_kind(data)}')
    if "lines" not in data:
        raise RequestError("lines is missing: a list of strings to translate", "lines")
    lines = _lines(data["lines"], limits)
    target_lang = data.get("target_lang")
    if target_lang is not None and not isinstance(target_lang, str):
        raise RequestError(f"target_lang must be a string, not {_kind(target_lang)}", "target_lang")
    given = {}
    for name, value in data.items():
        if name in ("lines", "target_lang"):
            continue
        if name not in OPTION_TYPES:
            known = ", ".join(["lines", "target_lang", *OPTION_TYPES])
            raise RequestError(f"unknown field {name!r}; the fields are {known}", name)
        given[name] = _option(name, value)
    for name in ("beam_size", "nbest"):
        if given.get(name, 0) > limits.max_beam_size:
            raise RequestError(
                f"{name} {given[name]} is over this server's limit, {limits.max_beam_size}", name
            )
    try:
        options = replace(defaults, **given)
    except ValueError as err:
        raise RequestError(str(err), _field_named(str(err), set(given))) from None
    return TranslationRequest(lines, options, target_lang or None)
