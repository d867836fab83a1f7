"""End to end on the real vLLM backend: a frontend on a headless vllm rank (the one test_engine_vllm
drives; managed mode on vllm is test_grpc_vllm's) answering the official openai SDK, streamed and not:
its logprobs against vLLM's own offline LLM, forced tool calls, structured outputs (every field that
asks for one), logits controls, prompt truncation, what vLLM cannot compile a 400, and logprobs of a
constrained request."""
from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.procs import FrontendProc

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def frontend(vllm_frontend: FrontendProc) -> FrontendProc:
    """A frontend on a headless vLLM rank (tests/vllm/conftest.py: shared across modules)."""
    return vllm_frontend


def test_chat_and_completion_through_vllm(frontend: FrontendProc) -> None:
    before = _settled_metrics(frontend)  # the engine and frontend are shared: count from here
    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "你好"}],
                                          max_tokens=24, temperature=0)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 24  # type: ignore[union-attr]
    streamed = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "你好"}],
                                              max_tokens=24, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content  # greedy: the same tokens both ways
    done = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 8  # type: ignore[union-attr]
    client.close()
    # vLLM's own request events, as the engine's timings (protocol 1.4), in vLLM's histograms per rank.
    # Tokens per step as vLLM counts them: each prompt once (none is a full block: no cache hits), and
    # every generated token; one request at a time, so a step per generated token.
    prompts = 2 * chat.usage.prompt_tokens + done.usage.prompt_tokens  # type: ignore[union-attr]

    def added(text: str, name: str) -> float:  # a histogram with no observations yet has no series
        return _series(text, name) - (_series(before, name) if re.search(f"^{re.escape(name)}{{", before, re.M) else 0)

    deadline = time.monotonic() + 10
    while True:  # the engine's counters arrive with its next Stats
        text = httpx.get(frontend.url + "/metrics", timeout=10).text
        if added(text, "vllm:iteration_tokens_total_sum") == prompts + 24 + 24 + 8:
            break
        assert time.monotonic() < deadline, (added(text, "vllm:iteration_tokens_total_sum"), prompts + 56, text)
        time.sleep(0.1)
    assert added(text, "vllm:iteration_tokens_total_count") == 24 + 24 + 8
    for phase in ("queue", "prefill", "decode", "inference"):
        assert added(text, f"vllm:request_{phase}_time_seconds_count") == 3, phase
    assert added(text, "vllm:request_decode_time_seconds_sum") > 0
    assert 'vllm:num_preemptions_total{engine="0",model_name="tiny"}' in text


def _settled_metrics(frontend: FrontendProc) -> str:
    """/metrics once the engine's counters include every step before now (no event tells it): the same
    iteration tokens in two reads 1 s apart, an idle frontend seeing the engine's Stats (sent every
    ~100 ms) at least every 0.5 s."""
    deadline = time.monotonic() + 10
    last = None
    while True:
        text = httpx.get(frontend.url + "/metrics", timeout=10).text
        value = _series(text, "vllm:iteration_tokens_total_sum")
        if value == last:
            return text
        assert time.monotonic() < deadline, text
        last = value
        time.sleep(1.0)


def _series(text: str, name: str) -> float:
    """The value of `name` for engine rank 0."""
    found = re.search(rf'^{re.escape(name)}{{engine="0",model_name="tiny"}} (\S+)$', text, re.M)
    assert found, (name, text)
    return float(found.group(1))


TOOLS: list = [  # type: ignore[type-arg]
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_choice_gives_calls_that_match_the_tools_schemas(frontend: FrontendProc, stream: bool) -> None:
    """Random weights write no calls on their own: only vLLM's structured output makes these valid."""
    from jsonschema import validate

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "weather and time?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        # One call at most: random weights would add array items until max_tokens cut them.
        kwargs = {"model": "tiny", "messages": ask, "tools": TOOLS, "tool_choice": choice, "max_tokens": 200,
                  "temperature": 0, "parallel_tool_calls": False}
        if stream:
            calls: dict[int, dict[str, str]] = {}
            for chunk in client.chat.completions.create(stream=True, **kwargs):  # type: ignore[call-overload]
                for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    entry = calls.setdefault(c.index, {"name": "", "arguments": ""})
                    entry["name"] += (c.function.name or "") if c.function else ""
                    entry["arguments"] += (c.function.arguments or "") if c.function else ""
            got = [(v["name"], v["arguments"]) for _, v in sorted(calls.items())]
        else:
            r = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
            assert r.choices[0].finish_reason == "stop"
            got = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []]
        assert got, choice
        if isinstance(choice, dict):
            assert [name for name, _ in got] == ["get_time"]
        for name, arguments in got:
            validate(json.loads(arguments), schemas[name])
    client.close()


def test_required_streams_the_calls_it_answers_whole(frontend: FrontendProc) -> None:
    """Greedy, so the same tokens both ways: the streamed pieces join to the whole answer's calls,
    the first piece of each call carrying its id and name, and arrive in more than one delta."""
    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    kwargs = {"model": "tiny", "messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS,
              "tool_choice": "required", "max_tokens": 200, "temperature": 0, "parallel_tool_calls": False}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    expected = [(c.id, c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]
    pieces: list[tuple[int, str | None, str | None, str]] = []
    for chunk in client.chat.completions.create(stream=True, **kwargs):  # type: ignore[call-overload]
        for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            pieces.append((c.index, c.id, c.function.name if c.function else None,
                           (c.function.arguments or "") if c.function else ""))
    client.close()
    assert len(expected) == 1 and len(pieces) > 1
    index, call_id, name, _ = pieces[0]
    assert index == 0 and call_id and name == expected[0][1]
    assert all(p[0] == 0 and p[1] is None and p[2] is None for p in pieces[1:])
    assert "".join(p[3] for p in pieces) == expected[0][2]
    json.loads(expected[0][2])


def _close(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) < 1e-4


def test_n_seeded_choices_equal_vllm_offline_n(frontend: FrontendProc, llm: Any) -> None:
    """n=3 with a seed, sampled (temperature 1): our three engine requests, seeded seed + j, give the
    choices vLLM's own n=3 gives (its ParentRequest seeds its children so), in order; a batch of two
    prompts gives each prompt's."""
    from vllm import SamplingParams

    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in ("Once upon a time", "The sea is")]
    params = SamplingParams(n=3, seed=11, temperature=1.0, max_tokens=8)
    refs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    want = [[o.text for o in sorted(ref.outputs, key=lambda o: o.index)] for ref in refs]
    r = client.completions.create(model="tiny", prompt=prompts[0], n=3, seed=11, temperature=1.0, max_tokens=8)
    assert [c.text for c in r.choices] == want[0] and len(set(want[0])) == 3
    batch = client.completions.create(model="tiny", prompt=prompts, n=3, seed=11, temperature=1.0, max_tokens=8)
    assert [c.text for c in batch.choices] == want[0] + want[1]


def test_logprobs_equal_vllm_offline_generate(frontend: FrontendProc, llm: Any) -> None:
    """The same greedy requests through our HTTP API and through vLLM's LLM.generate: tokens, their
    strings (vLLM's decoded_token), the sampled logprobs and the top-5 alternatives to 1e-4, and
    vLLM's prompt_logprobs field; chat streamed, completions not."""
    from vllm import SamplingParams

    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=5, prompt_logprobs=5)

    # Completions with a token prompt: vLLM's columns, each top dict the token and its 5 alternatives.
    prompt = tokenizer.encode("The capital of France is", add_special_tokens=False)
    ref = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    out = ref.outputs[0]
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logprobs=5,
                                  extra_body={"prompt_logprobs": 5})
    lp = r.choices[0].logprobs
    assert r.choices[0].text == out.text
    assert lp.tokens == [step[t].decoded_token for step, t in zip(out.logprobs, out.token_ids, strict=True)]
    for got, got_tops, step, t in zip(lp.token_logprobs, lp.top_logprobs, out.logprobs, out.token_ids, strict=True):
        assert _close(got, step[t].logprob)
        want = {p.decoded_token: p.logprob for p in step.values()}  # the token first, then by rank
        assert list(got_tops) == list(want) and all(_close(got_tops[s], v) for s, v in want.items())
    prompt_logprobs = r.choices[0].model_extra["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ref.prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None
    for got_pos, want_pos in zip(prompt_logprobs[1:], ref.prompt_logprobs[1:], strict=True):
        assert [int(t) for t in got_pos] == list(want_pos)
        for t, cell in got_pos.items():
            want = want_pos[int(t)]
            assert (cell["rank"], cell["decoded_token"]) == (want.rank, want.decoded_token)
            assert _close(cell["logprob"], want.logprob)

    # Chat, streamed: the same prompt as our template renders it; top_logprobs in rank order.
    messages = [{"role": "user", "content": "你好, who are you?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chat_prompt = tokenizer.encode(text, add_special_tokens=False)
    ref = llm.generate([{"prompt_token_ids": chat_prompt}], params, use_tqdm=False)[0].outputs[0]
    entries = [e for c in client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                       logprobs=True, top_logprobs=5, stream=True)
               if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == len(ref.token_ids)
    for entry, step, t in zip(entries, ref.logprobs, ref.token_ids, strict=True):
        assert entry.token == step[t].decoded_token and _close(entry.logprob, step[t].logprob)
        assert entry.bytes == list(step[t].decoded_token.encode())
        ranked = sorted((p for p in step.values() if p.rank <= 5), key=lambda p: p.rank)
        assert [a.token for a in entry.top_logprobs] == [p.decoded_token for p in ranked]
        assert all(_close(a.logprob, p.logprob) for a, p in zip(entry.top_logprobs, ranked, strict=True))
    client.close()


SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Tokyo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "sunny": {"type": "boolean"}}, "required": ["city", "days", "sunny"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Weather in Paris for three days, as JSON?"}]


@pytest.fixture
def client(frontend: FrontendProc) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        yield c


def _chat(client: openai.OpenAI, stream: bool = False, **kwargs: Any) -> tuple[str, str | None]:
    """The answer's content and finish_reason, streamed or not."""
    body = {"model": "tiny", "messages": ASK, "max_tokens": 120, "temperature": 0, **kwargs}
    if not stream:
        r = client.chat.completions.create(**body)
        return r.choices[0].message.content or "", r.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **body):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema_output_validates(client: openai.OpenAI, stream: bool) -> None:
    """Random weights: only vLLM's structured output makes this valid JSON of this schema."""
    from jsonschema import validate

    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    text, finish = _chat(client, stream, response_format=fmt)
    validate(json.loads(text), SCHEMA)
    assert finish == "stop"
    plain, _ = _chat(client, stream)
    with pytest.raises(ValueError):  # the same request unconstrained is no such JSON
        validate(json.loads(plain), SCHEMA)


@pytest.mark.parametrize("ask", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}},
    {"extra_body": {"structured_outputs": {"json": SCHEMA}}},
    {"extra_body": {"guided_json": json.dumps(SCHEMA)}},
], ids=["response_format", "structured_outputs", "guided_json"])
def test_every_field_that_asks_for_a_schema_gives_the_same_answer(client: openai.OpenAI, ask: dict[str, Any]) -> None:
    from jsonschema import validate

    text, _ = _chat(client, **ask)
    validate(json.loads(text), SCHEMA)


def test_json_object_output_parses_as_an_object(client: openai.OpenAI) -> None:
    """Any object: random weights would write one key's string until max_tokens, so a bias towards
    closing quotes and braces lets it end; the same bias without json_object gives no object."""
    from services.frontend.model import Model

    tokenizer = Model.load("tiny", "tiny").tokenizer
    def is_object(text: str) -> bool:
        try:
            return isinstance(json.loads(text), dict)
        except ValueError:
            return False

    bias = {str(tokenizer.token_to_id('"')): 100, str(tokenizer.token_to_id("}")): 50}
    text, finish = _chat(client, response_format={"type": "json_object"}, logit_bias=bias)
    assert is_object(text) and finish == "stop", text
    plain, _ = _chat(client, logit_bias=bias, max_tokens=20)
    assert not is_object(plain), plain


@pytest.mark.parametrize("field", ["structured_outputs", "guided"])
def test_regex_choice_and_grammar_outputs_match(client: openai.OpenAI, field: str) -> None:
    def ask(kind: str, value: Any) -> str:
        extra = {"structured_outputs": {kind: value}} if field == "structured_outputs" else {f"guided_{kind}": value}
        text, finish = _chat(client, extra_body=extra)
        assert finish == "stop", (kind, text)
        return text

    assert re.fullmatch(r"[a-z]{3,8}-[0-9]{2}", ask("regex", r"[a-z]{3,8}-[0-9]{2}"))
    assert ask("choice", ["yes", "no", "maybe"]) in ("yes", "no", "maybe")
    ebnf = 'root ::= "The answer is " ("yes" | "no") "."'
    assert ask("grammar", ebnf) in ("The answer is yes.", "The answer is no.")
    lark = 'start: "colour: " COLOUR\nCOLOUR: "red" | "green" | "blue"'  # xgrammar reads Lark too
    assert ask("grammar", lark) in ("colour: red", "colour: green", "colour: blue")


def test_completions_take_structured_outputs_too(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="The code is", max_tokens=20, temperature=0,
                                  extra_body={"structured_outputs": {"regex": r"[A-Z]{4}"}})
    assert re.fullmatch(r"[A-Z]{4}", r.choices[0].text) and r.choices[0].finish_reason == "stop"


def test_logit_bias_allowed_token_ids_and_bad_words(client: openai.OpenAI) -> None:
    from services.frontend.model import Model

    tokenizer = Model.load("tiny", "tiny").tokenizer
    word = tokenizer.encode(" Paris", add_special_tokens=False).ids
    assert len(word) == 1
    kwargs: Any = {"model": "tiny", "prompt": "Weather in", "max_tokens": 6, "temperature": 0}
    biased = client.completions.create(logit_bias={str(word[0]): 100}, **kwargs).choices[0].text
    assert biased == " Paris" * 6
    allowed = [tokenizer.token_to_id(t) for t in ("yes", "no", ",")]
    text = client.completions.create(extra_body={"allowed_token_ids": allowed}, **kwargs).choices[0].text
    assert re.fullmatch(r"(yes|no|,)+", text), text
    plain = client.completions.create(**kwargs).choices[0].text
    first = plain.split()[0]
    banned = client.completions.create(extra_body={"bad_words": [first]}, **kwargs).choices[0].text
    assert first in plain.split() and first not in banned.split(), (plain, banned)


def test_truncate_prompt_tokens_keeps_the_last_tokens(client: openai.OpenAI) -> None:
    long = "one two three four five six seven eight nine ten " * 5
    r = client.completions.create(model="tiny", prompt=long, max_tokens=1, temperature=0,
                                  extra_body={"truncate_prompt_tokens": 7})
    assert r.usage is not None and r.usage.prompt_tokens == 7


@pytest.mark.parametrize(("extra", "param", "needle"), [
    # xgrammar cannot compile these, and only the engine can tell: its refusal is a 400 naming the field.
    ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar",
     "vLLM's structured output (xgrammar) cannot use it: Invalid grammar specification."),
    ({"guided_regex": "(a"}, "guided_regex", "Failed to transform regex into a grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}},
     "response_format.json_schema.schema", "Cannot find field nowhere"),
    # The frontend's own checks.
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": 5}}}},
     "response_format.json_schema.schema.type", "is not a valid JSON Schema"),
    ({"logit_bias": {"999999": 5}}, "logit_bias", "out of range"),
])
def test_what_cannot_be_compiled_or_is_out_of_range_is_a_400_naming_the_field(
        client: openai.OpenAI, extra: dict[str, Any], param: str, needle: str) -> None:
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            _chat(client, stream, extra_body=extra)
        body = info.value.body
        assert isinstance(body, dict) and body["param"] == param and needle in body["message"], body
    assert _chat(client, max_tokens=2)[1] == "length"  # the engine is unharmed


def test_logprobs_of_a_constrained_completion_equal_vllm_offline_generate(client: openai.OpenAI, llm: Any) -> None:
    """Structured output and logprobs in one request: the text matches the regex, and its tokens,
    their strings and logprobs, and the echoed prompt's logprobs are vLLM's for the same request."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    regex = r"[a-z]{3,8}-[0-9]{2}"
    prompt = llm.get_tokenizer().encode("The code is", add_special_tokens=False)
    ref = llm.generate([{"prompt_token_ids": prompt}],
                       SamplingParams(temperature=0, max_tokens=20, logprobs=2, prompt_logprobs=2,
                                      structured_outputs=StructuredOutputsParams(regex=regex)), use_tqdm=False)[0]
    out = ref.outputs[0]
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0, logprobs=2, echo=True,
                                  extra_body={"structured_outputs": {"regex": regex}})
    choice = r.choices[0]
    prompt_text = llm.get_tokenizer().decode(prompt)
    assert choice.text == prompt_text + out.text and re.fullmatch(regex, out.text) and choice.finish_reason == "stop"
    lp = choice.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.tokens is not None
    n = len(prompt)
    assert lp.token_logprobs[0] is None and len(lp.tokens) == n + len(out.token_ids)
    for got, step, t in zip(lp.token_logprobs[1:n], ref.prompt_logprobs[1:], prompt[1:], strict=True):
        assert _close(got, step[t].logprob)
    assert lp.tokens[n:] == [step[t].decoded_token for step, t in zip(out.logprobs, out.token_ids, strict=True)]
    for got, step, t in zip(lp.token_logprobs[n:], out.logprobs, out.token_ids, strict=True):
        assert _close(got, step[t].logprob)
