"""The mistral tool parser: both call formats after [TOOL_CALLS], however the output was split."""
from __future__ import annotations

import json

import pytest

from services.frontend.parsers.mistral import MistralToolParser
from tests.unit.frontend.parsers.harness import Final, args, check_all_ways, drive

TRICKY = {"q": "naïve 日本語 🎉", "nested": {"a": [1, {"b": "}"}], "s": 'quote " } ] , [TOOL_CALLS]'}}


def mistral_id(call_id: str) -> bool:
    return len(call_id) == 9 and call_id.isalnum()


def v7(*calls: tuple[str, dict[str, object]]) -> str:
    return "[TOOL_CALLS] [" + ", ".join(f'{{"name": "{n}", "arguments": {args(a)}}}' for n, a in calls) + "]"


# (id, model output, final content, final calls)
CASES = [
    ("plain", "No tools [here] {x}.", "No tools [here] {x}.", ()),
    ("v11 one call", '[TOOL_CALLS]get_weather{"city": "Paris"}', "", (("get_weather", '{"city": "Paris"}'),)),
    ("v11 with ARGS", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", (("get_weather", '{"city": "Paris"}'),)),
    ("v11 parallel", '[TOOL_CALLS]f{"a": 1}[TOOL_CALLS]g{}\n[TOOL_CALLS]h' + args(TRICKY), "",
     (("f", '{"a": 1}'), ("g", "{}"), ("h", args(TRICKY)))),
    ("text then v11 call", 'Let me check.\n[TOOL_CALLS]f{"a": 1}', "Let me check.\n", (("f", '{"a": 1}'),)),
    ("text after v11 call", '[TOOL_CALLS]f{"a": 1}\n\nDone.', "Done.", (("f", '{"a": 1}'),)),
    ("array", v7(("f", {"a": 1}), ("g", TRICKY)), "", (("f", args({"a": 1})), ("g", args(TRICKY)))),
    ("text then array", "Sure. " + v7(("f", {})), "Sure. ", (("f", "{}"),)),
    ("array, text after", v7(("f", {})) + " ok", "ok", (("f", "{}"),)),
    ("v11 bad name", "[TOOL_CALLS]not a name{}", "[TOOL_CALLS]not a name{}", ()),
    ("cut in the marker", "Hi [TOOL_CA", "Hi [TOOL_CA", ()),
    ("cut in the name", "[TOOL_CALLS]get_wea", "[TOOL_CALLS]get_wea", ()),
    # Never a call the model did not finish: what is not one is content as written.
    ("cut in the arguments", '[TOOL_CALLS]f{"a": "x', '[TOOL_CALLS]f{"a": "x', ()),
    ("malformed arguments", '[TOOL_CALLS]f[ARGS]{"a": 1,}', '[TOOL_CALLS]f[ARGS]{"a": 1,}', ()),
    ("a call, then one cut", '[TOOL_CALLS]f{"a": 1}[TOOL_CALLS]g{"b": "x', '[TOOL_CALLS]g{"b": "x',
     (("f", '{"a": 1}'),)),
    # The array format alike: its marker and "[" stay with the text when no call came of it.
    ("array malformed", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1,}}]',
     '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1,}}]', ()),
    ("array cut", '[TOOL_CALLS][{"name": "f", "arguments": {"a": "x',
     '[TOOL_CALLS][{"name": "f", "arguments": {"a": "x', ()),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_splitting_gives_the_same_result(text: str, content: str, calls: tuple[tuple[str, str], ...]) -> None:
    check_all_ways(MistralToolParser, text, Final(content, "", calls), id_ok=mistral_id,
                   tags_are_real="[TOOL_CALLS]" not in content)


def test_a_call_is_sent_whole_once_its_arguments_close() -> None:
    parser = MistralToolParser()
    assert parser.push('[TOOL_CALLS]f{"a": "lo').tool_calls == []
    assert [(d.index, d.name, d.arguments) for d in parser.push('ng"}').tool_calls] == [(0, "f", '{"a": "long"}')]
    parser.flush()
    assert json.loads(parser.calls()[0].arguments) == {"a": "long"}


def test_no_marker_in_content() -> None:
    _, deltas = drive(MistralToolParser(), list('Hi [TOOL_CALLS]f{"a": 1}'), id_ok=mistral_id)
    assert "".join(d.content for d in deltas) == "Hi "
