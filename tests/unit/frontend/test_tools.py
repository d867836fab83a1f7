from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import pytest

from services.frontend.errors import APIError
from services.frontend.requests.tools import AUTO_NEEDS_FLAGS, MAX_SCHEMA_BYTES, check_tools, resolve_tool_choice

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "web-search_2"}}


def _tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": function}


def _refused_tools(tools: Any) -> APIError:
    with pytest.raises(APIError) as info:
        check_tools(tools)
    assert info.value.status == 400
    return info.value


def _choice(choice: Any, tools: tuple[dict[str, Any], ...] = (WEATHER, SEARCH), **flags: Any) -> Any:
    return resolve_tool_choice(choice, tools, enable_auto_tool_choice=flags.get("enable", False),
                               tool_call_parser=flags.get("parser"))


def _refused_choice(choice: Any, tools: tuple[dict[str, Any], ...] = (WEATHER, SEARCH), **flags: Any) -> APIError:
    with pytest.raises(APIError) as info:
        _choice(choice, tools, **flags)
    assert info.value.status == 400
    return info.value


def test_tools_are_kept_as_given() -> None:
    tools = [copy.deepcopy(WEATHER), {"function": {"name": "x", "parameters": {}, "extra": 1}}, SEARCH]
    assert check_tools(tools) == tuple(tools)
    assert check_tools(None) == ()


@pytest.mark.parametrize(("tools", "param", "needle"), [
    ([], "tools", "must not be an empty array"),
    ([WEATHER, {"type": "retrieval", "function": {"name": "f"}}], "tools[1].type",
     "'retrieval' is not supported: the only tool type is \"function\""),
    ([{"type": "function"}], "tools[0].function", 'required: an object {"name", "description"?'),
    ([WEATHER, SEARCH, _tool(name="has space")], "tools[2].function.name",
     "'has space' is not a valid name: it must be 1 to 64 characters of a-z, A-Z, 0-9, underscores and dashes"),
    ([_tool(name="")], "tools[0].function.name", "is not a valid name"),
    ([_tool(name="a" * 65)], "tools[0].function.name", "1 to 64 characters"),
    ([_tool(name="café")], "tools[0].function.name", "is not a valid name"),
    ([_tool(description="no name")], "tools[0].function.name", "None is not a valid name"),
    ([_tool(name=7)], "tools[0].function.name", "7 is not a valid name"),
    ([_tool(name="f", description=3)], "tools[0].function.description", "must be a string or null"),
    ([_tool(name="f", strict="yes")], "tools[0].function.strict", "must be a boolean or null"),
    ([_tool(name="f", parameters=[1])], "tools[0].function.parameters", "must be a JSON Schema object, got list"),
    ([WEATHER, SEARCH, copy.deepcopy(WEATHER)], "tools[2].function.name",
     "'get_weather' is also the name of tools[0]; tool names must be unique"),
])
def test_bad_tools_are_400s_naming_the_field(tools: Any, param: str, needle: str) -> None:
    err = _refused_tools(tools)
    assert err.param == param and needle in err.message, err.message
    assert err.message.startswith(param + ": ")


def test_name_at_the_limit_is_accepted() -> None:
    assert check_tools([_tool(name="a" * 64)])


def test_parameters_must_be_a_valid_json_schema() -> None:
    bad = _tool(name="f", parameters={"type": "object", "properties": {"city": {"type": "strin"}}})
    err = _refused_tools([WEATHER, bad])
    assert err.param == "tools[1].function.parameters.properties.city.type"
    assert 'is not a valid JSON Schema (draft 2020-12): "strin" is not valid' in err.message
    err = _refused_tools([_tool(name="f", parameters={"required": "city"})])
    assert err.param == "tools[0].function.parameters.required" and 'is not of type "array"' in err.message


def test_absent_tool_choice_is_auto_beside_tools_and_none_without() -> None:
    assert _choice(msgspec.UNSET, ()) == "none"
    assert _refused_choice(msgspec.UNSET).message == AUTO_NEEDS_FLAGS


def test_none_and_null_are_accepted_with_or_without_tools() -> None:
    assert _choice("none") == "none" and _choice(None) == "none"
    assert _choice("none", ()) == "none" and _choice(None, ()) == "none"  # as vLLM


def test_auto_needs_both_server_flags() -> None:
    err = _refused_choice("auto")
    assert err.param == "tool_choice"
    assert err.message == '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    assert _refused_choice("auto", enable=True).message == AUTO_NEEDS_FLAGS
    assert _refused_choice("auto", parser="hermes").message == AUTO_NEEDS_FLAGS
    assert _choice("auto", enable=True, parser="hermes") == "auto"


@pytest.mark.parametrize(("choice", "tools", "param", "needle"), [
    ("auto", (), "tool_choice", "When using `tool_choice`, `tools` must be set."),
    ("required", (), "tool_choice", "When using `tool_choice`, `tools` must be set."),
    ({"type": "function", "function": {"name": "get_weather"}}, (), "tool_choice", "`tools` must be set"),
    ("any", (WEATHER,), "tool_choice",
     'tool_choice: \'any\' is not one of "none", "auto", "required" or {"type": "function", "function": '
     '{"name": ...}}'),
    (["auto"], (WEATHER,), "tool_choice", "is not one of"),
    ({"type": "custom", "function": {"name": "get_weather"}}, (WEATHER,), "tool_choice.type",
     "'custom' is not one of"),
    ({"type": "function"}, (WEATHER,), "tool_choice.function", 'required: an object {"name": ...}'),
    ({"type": "function", "function": {}}, (WEATHER, SEARCH), "tool_choice.function.name",
     "required: the name of one of the tools (get_weather, web-search_2)"),
    ({"type": "function", "function": {"name": "nope"}}, (WEATHER, SEARCH), "tool_choice.function.name",
     "'nope' does not match any of the tools: get_weather, web-search_2"),
])
def test_bad_tool_choice_is_a_400_naming_the_field(choice: Any, tools: tuple[dict[str, Any], ...], param: str,
                                                    needle: str) -> None:
    err = _refused_choice(choice, tools)
    assert err.param == param and needle in err.message, err.message


def test_required_and_named_need_no_parser_and_name_the_function_as_given() -> None:
    assert _choice("required", (WEATHER,)) == "required"
    named = {"function": {"name": "web-search_2"}}  # type may be left out, as OpenAI's SDK allows
    assert _choice(named, (WEATHER, SEARCH)) == {"type": "function", "function": {"name": "web-search_2"}}


def test_forced_schemas_are_the_parameters_or_an_array_of_named_calls() -> None:
    from services.frontend.requests.tools import forced_schema

    named = {"type": "function", "function": {"name": "get_weather"}}
    assert json.loads(forced_schema(named, (WEATHER, SEARCH), parallel=True)) == WEATHER["function"]["parameters"]
    array = json.loads(forced_schema("required", (WEATHER, SEARCH), parallel=True))
    assert array["type"] == "array" and array["minItems"] == 1 and "maxItems" not in array
    shapes = array["items"]["anyOf"]
    assert [s["properties"]["name"] for s in shapes] == [{"type": "string", "enum": ["get_weather"]},
                                                          {"type": "string", "enum": ["web-search_2"]}]
    assert shapes[0]["properties"]["parameters"] == WEATHER["function"]["parameters"]
    assert shapes[1]["properties"]["parameters"] == {"type": "object"}  # a tool without parameters
    assert json.loads(forced_schema("required", (WEATHER,), parallel=False))["maxItems"] == 1


def test_a_schema_past_the_size_limit_is_refused_naming_the_field_and_the_limit() -> None:
    props = {f"p{i}": {"type": "string", "description": "a field"} for i in range(25_000)}  # 1.2 MiB
    err = _refused_tools([WEATHER, _tool(name="f", parameters={"type": "object", "properties": props})])
    assert err.param == "tools[1].function.parameters"
    assert f"at most {MAX_SCHEMA_BYTES:,} are accepted" in err.message and "1,263,922 bytes" in err.message


def test_a_schema_just_under_the_limit_is_checked_against_the_meta_schema() -> None:
    props = {f"p{i}": {"type": "string", "description": "a field"} for i in range(5_000)}
    big = {"type": "object", "properties": props}
    assert len(json.dumps(big, separators=(",", ":"))) < MAX_SCHEMA_BYTES
    assert check_tools([_tool(name="f", parameters=big)])
    props["p4999"] = {"type": "strin"}
    err = _refused_tools([_tool(name="f", parameters=big)])
    assert err.param == "tools[0].function.parameters.properties.p4999.type"


@pytest.mark.parametrize("schema", [{"$ref": "http://169.254.169.254/latest"}, {"$schema": "http://127.0.0.1:1/x"}])
def test_a_schema_referring_elsewhere_is_not_fetched(schema: dict[str, Any]) -> None:
    """Nothing is fetched: the meta-schema check looks at the schema's own shape only (a $ref is a string)."""
    assert check_tools([_tool(name="f", parameters=schema)])


def test_a_pattern_must_be_a_regex() -> None:
    err = _refused_tools([_tool(name="f", parameters={"type": "string", "pattern": "(a"})])
    assert err.param == "tools[0].function.parameters.pattern" and 'is not a "regex"' in err.message
