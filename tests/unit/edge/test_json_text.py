"""The JSON entry rules of edge/json_text.py: a lone surrogate escape made U+FFFD (and nothing else
changed, escaped backslashes and real pairs included), and the field that holds a NaN or Infinity."""
from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.json_text import lone_surrogates_replaced, non_finite


@pytest.mark.parametrize(("raw", "text"), [
    (rb'"a\ud800"', "a\ufffd"),  # a high one at the end
    (rb'"\ud800x"', "\ufffdx"),
    (rb'"\udc00b"', "\ufffdb"),  # a low one alone
    (rb'"\ud800\ud800"', "\ufffd\ufffd"),  # two highs are no pair
    (rb'"\ud83d\ude00 \ud83d"', "\U0001f600 \ufffd"),  # a pair kept, an emoji cut after its first half
])
def test_lone_surrogates_become_the_replacement_character(raw: bytes, text: str) -> None:
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(raw)
    assert msgspec.json.decode(lone_surrogates_replaced(raw)) == text


@pytest.mark.parametrize("raw", [rb'"\\ud800"', rb'"\uDBFF\uDFFF"', rb'"\\\\\ud83d\ude00"', rb'{"a": "\u00e9"}',
                                 b'"plain"'])
def test_what_is_not_a_lone_surrogate_is_left_alone(raw: bytes) -> None:
    assert lone_surrogates_replaced(raw) is raw


def _lenient(text: str) -> str:
    """What a lenient decoder makes of UTF-16 code units: a high and a low surrogate side by side are
    one character, any other surrogate is U+FFFD."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if "\ud800" <= c <= "\udbff" and i + 1 < len(text) and "\udc00" <= text[i + 1] <= "\udfff":
            out.append(chr(0x10000 + ((ord(c) - 0xD800) << 10) + ord(text[i + 1]) - 0xDC00))
            i += 2
            continue
        out.append("\ufffd" if "\ud800" <= c <= "\udfff" else c)
        i += 1
    return "".join(out)


@settings(max_examples=300, derandomize=True, database=None)  # the same examples every run
@given(st.text(alphabet=st.sampled_from(["a", "\\", "\ud800", "\udbff", "\udc00", "\udfff", "\U0001f600", "u"])))
def test_any_string_decodes_as_a_lenient_decoder_reads_it(text: str) -> None:
    """json.dumps writes every surrogate a Python string holds (lone ones too) as an escape."""
    raw = json.dumps(text).encode()
    assert msgspec.json.decode(lone_surrogates_replaced(raw)) == _lenient(text)


@pytest.mark.parametrize(("raw", "found"), [
    (b'{"temperature": NaN}', ("temperature", "NaN")),
    (b'{"model": "NaN", "top_p": -Infinity}', ("top_p", "-Infinity")),
    (b'{"messages": [{"content": "x"}, {"x": [1, Infinity]}]}', ("messages[1].x[1]", "Infinity")),
    (b"NaN", ("", "NaN")),
    (b'{"top_p": 1e400}', ("top_p", "1e400")),
    (b'{"x": [1.0, -2E+0400]}', ("x[1]", "-2E+0400")),
])
def test_the_field_holding_a_non_finite_number_is_named(raw: bytes, found: tuple[str, str]) -> None:
    assert non_finite(raw) == found


@pytest.mark.parametrize("raw", [b'{"a": "NaN and Infinity"}', b'{"a": 1', b'{"a": 1.5}', b'{"a": 1e300}'])
def test_no_non_finite_number_no_answer(raw: bytes) -> None:
    assert non_finite(raw) is None
