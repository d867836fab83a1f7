"""JsonScan: where a JSON value ends, found across pieces however the text was split."""
from __future__ import annotations

import pytest

from services.frontend.parsers.json_scan import JsonScan


def scan_in_pieces(scan: JsonScan, text: str, cut: int) -> int | None:
    """The end index in `text` the scan finds when fed text[:cut] then text[cut:]; None if open."""
    end = scan.scan(text[:cut])
    if scan.closed:
        return end
    end = scan.scan(text[cut:])
    return cut + end if scan.closed else None


@pytest.mark.parametrize(("text", "end"), [
    ('{"a": "}", "b": [1, {"c": "]"}]} tail', 32),
    ('{"q": "say \\"}\\" and \\\\"} tail', 25),
    ("[[], {}] ,", 8),
    ('{"a": 1', None),
])
def test_a_bracketed_value_ends_at_its_closing_bracket(text: str, end: int | None) -> None:
    for cut in range(len(text) + 1):
        assert scan_in_pieces(JsonScan(), text, cut) == end, cut


@pytest.mark.parametrize(("text", "end"), [
    ('name", "x"', 5),
    ('a \\"quoted\\" } ] word", 1', 22),
    ('ends in a backslash\\\\": 2', 22),
    ("日本語 🎉\\u00e9\": 3", 12),
    ('never closed \\"', None),
])
def test_a_scan_begun_inside_a_string_ends_with_that_string(text: str, end: int | None) -> None:
    for cut in range(len(text) + 1):
        assert scan_in_pieces(JsonScan(in_string=True), text, cut) == end, cut


def test_a_string_outside_brackets_does_not_end_a_plain_scan() -> None:
    scan = JsonScan()
    assert scan.scan('"a" {"b": 1} "c"') == 12 and scan.closed
