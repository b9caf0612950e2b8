"""A request's body, checked field by field: what is accepted is what was asked for, and what is
refused names its field (no server, no model: ``requests.py`` alone)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decoding import DecodingConfig
from translation.serve.requests import OPTION_TYPES, RequestError, RequestLimits, parse_request

DEFAULTS = DecodingConfig()
LIMITS = RequestLimits(max_lines=20, max_body_bytes=10_000, max_beam_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-100, 100) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=5,
)


def parse(data: object) -> object:
    return parse_request(json.dumps(data).encode(), DEFAULTS, LIMITS)


def test_the_options_are_the_decoding_configs_scalar_fields() -> None:
    assert {"beam_size", "greedy", "nbest", "alpha", "sampling", "topk", "topp", "seed"} <= set(OPTION_TYPES)
    assert (
        OPTION_TYPES["beam_size"] is int and OPTION_TYPES["greedy"] is bool and OPTION_TYPES["alpha"] is float
    )


@given(st.lists(st.text(max_size=20), max_size=LIMITS.max_lines))
def test_any_list_of_strings_is_taken_as_it_is(lines: list[str]) -> None:
    request = parse({"lines": lines})
    assert request.lines == lines and request.options == DEFAULTS and request.target_lang is None


@given(st.lists(st.text(max_size=5), min_size=1, max_size=10), st.data())
def test_a_line_that_is_not_a_string_is_named_by_its_index(lines: list[str], data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(lines) - 1))
    bad = data.draw(JSON_VALUES.filter(lambda v: not isinstance(v, str)))
    lines = [*lines[:i], bad, *lines[i + 1 :]]
    with pytest.raises(RequestError) as refused:
        parse({"lines": lines})
    assert (refused.value.field, refused.value.status) == (f"lines[{i}]", 400)


@given(st.sampled_from(sorted(OPTION_TYPES)), JSON_VALUES)
def test_an_option_is_taken_or_refused_naming_it(name: str, value: object) -> None:
    """Any JSON value in any option: it becomes that field of the config, or the error names it."""
    try:
        request = parse({"lines": ["a"], name: value})
    except RequestError as err:
        assert err.field == name and err.status == 400, (err, err.field)
        return
    assert getattr(request.options, name) == value
    assert type(value) is OPTION_TYPES[name] or (OPTION_TYPES[name] is float and type(value) is int)


@given(st.dictionaries(st.sampled_from(sorted(OPTION_TYPES)), JSON_VALUES, max_size=4))
def test_several_options_are_refused_naming_one_of_those_given(options: dict) -> None:
    try:
        request = parse({"lines": ["a"], **options})
    except RequestError as err:
        assert err.field in options, (err, err.field)
        return
    assert all(getattr(request.options, k) == v for k, v in options.items())


@pytest.mark.parametrize(
    ("body", "field", "status", "message"),
    [
        (b"\xff", None, 400, "not JSON"),
        (b"[]", None, 400, "JSON object"),
        (b'{"line": []}', "lines", 400, "lines is missing"),
        (b'{"lines": null}', "lines", 400, "not null"),
        (json.dumps({"lines": ["a"] * 21}).encode(), "lines", 400, "at most 20"),
        (b'{"lines": [], "target_lang": 3}', "target_lang", 400, "must be a string"),
        (b'{"lines": [], "beams": 3}', "beams", 400, "unknown field 'beams'"),
        (b'{"lines": [], "nbest": 9, "sampling": true}', "nbest", 400, "over this server's limit, 8"),
        (b'{"lines": [], "alpha": 1e999}', "alpha", 400, "must be a number"),
        (b'{"lines": ["' + b"x" * 10_000 + b'"]}', None, 413, "over the 10000 a request may have"),
    ],
)
def test_each_refusal_says_why(body: bytes, field: str | None, status: int, message: str) -> None:
    with pytest.raises(RequestError, match=message) as refused:
        parse_request(body, DEFAULTS, LIMITS)
    assert (refused.value.field, refused.value.status) == (field, status)
    assert refused.value.body() == {"error": str(refused.value), "field": field}


def test_the_request_overrides_the_servers_defaults() -> None:
    defaults = DecodingConfig(beam_size=3, greedy=True)
    request = parse_request(b'{"lines": ["a"], "greedy": false, "alpha": 1}', defaults, LIMITS)
    assert request.options == DecodingConfig(beam_size=3, alpha=1.0)
    assert parse_request(b'{"lines": [], "target_lang": ""}', defaults, LIMITS).target_lang is None
