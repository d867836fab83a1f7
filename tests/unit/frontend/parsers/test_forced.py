"""Forced tool_choice parsers: a named function's arguments streamed as they come, "required"'s array
of calls read whole at the end, cut output kept as content."""
from __future__ import annotations

import json

from services.frontend.parsers.forced import NamedToolParser, RequiredToolParser

ARGS = '{"city":"Paris","days":3}'


def test_a_named_call_streams_its_arguments_with_id_and_name_first() -> None:
    parser = NamedToolParser("get_weather")
    deltas = [parser.push(piece) for piece in (ARGS[:5], ARGS[5:11], ARGS[11:])] + [parser.flush()]
    first = deltas[0].tool_calls[0]
    assert (first.index, first.name, first.id and first.id.startswith("call_")) == (0, "get_weather", True)
    assert all(d.tool_calls[0].id is None and d.tool_calls[0].name is None for d in deltas[1:3])
    assert "".join(c.arguments for d in deltas for c in d.tool_calls) == ARGS
    [call] = parser.calls()
    assert (call.id, call.name, call.arguments) == (first.id, "get_weather", ARGS)
    assert all(d.content == "" and d.reasoning == "" for d in deltas)


def test_required_reads_the_array_whole_at_the_end() -> None:
    text = '[{"name":"a","parameters":{"x":"é"}},{"name":"b","parameters":{}}]'
    parser = RequiredToolParser()
    assert all(parser.push(text[i:i + 4]).tool_calls == [] for i in range(0, len(text), 4))
    tail = parser.flush()
    assert [(c.index, c.name, json.loads(c.arguments)) for c in tail.tool_calls] == [(0, "a", {"x": "é"}),
                                                                                     (1, "b", {})]
    assert [c.id for c in tail.tool_calls] == [c.id for c in parser.calls()]
    assert len({c.id for c in parser.calls()}) == 2 and tail.content == ""


def test_required_output_cut_short_is_content_as_written() -> None:
    parser = RequiredToolParser()
    parser.push('[{"name":"a","param')
    assert parser.flush().content == '[{"name":"a","param' and parser.calls() == []
    named = NamedToolParser("f")
    assert named.flush().tool_calls == [] and named.calls() == []
