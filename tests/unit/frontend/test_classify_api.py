"""POST /classify's translator (services/frontend/requests/classify.py, pooling_fields.py,
pooling_model.py): what reaches the engines checked against vLLM's own tokenizer and truncation, the
body checked against vLLM's pydantic ClassificationResponse, labels as transformers names them, and
every refusal a 400 naming the field."""
from __future__ import annotations

import pickle
from typing import Any

import pytest
from tokenizers import Tokenizer

import checkpoints
from prompting.model_files import model_config
from prompting.pooling_config import labels
from services.frontend.errors import APIError
from services.frontend.requests import classify
from services.frontend.requests.pooling_job import PoolingJob
from services.frontend.requests.pooling_model import PoolingModel

CHECKPOINT = checkpoints.resolve("tiny-classifier")  # random BERT weights, MiniLM's tokenizer
MAX_LEN = 64
TASKS = ("classify", "token_classify")  # what vLLM's engines serve for a sequence classifier
NAMED = model_config(CHECKPOINT)  # labels chat, code, math
TEXT = "the quick brown fox jumps over the lazy dog near the river bank"


def bare_tokenizer() -> Tokenizer:
    """The checkpoint's tokenizer (MiniLM's) as the frontend must load it: without the file's 128-token
    padding and truncation."""
    tokenizer = Tokenizer.from_file(str(CHECKPOINT / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@pytest.fixture(scope="module")
def model() -> PoolingModel:
    return PoolingModel.of("tiny-classifier", bare_tokenizer(), NAMED)


@pytest.fixture(scope="module")
def hf() -> Any:
    """vLLM's own tokenizer for this checkpoint, as its pooling runner loads it."""
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(CHECKPOINT), runner_type="pooling")


def vllm_ids(hf: Any, prompt: str | list[int], keep: int | None = None, side: str | None = None,
             add_special_tokens: bool = True) -> list[int]:
    """The token ids vLLM's renderer gives a classify prompt (its TokenizeParams, as a classify request
    builds them: the whole context, no output tokens)."""
    from vllm.renderers import TokenizeParams

    params = TokenizeParams(max_total_tokens=MAX_LEN, max_output_tokens=0, truncate_prompt_tokens=keep,
                            truncation_side=side, add_special_tokens=add_special_tokens)
    ids = prompt if isinstance(prompt, list) else hf(prompt, **params.get_encode_kwargs())["input_ids"]
    return params.apply_post_tokenization(hf, {"prompt_token_ids": list(ids)})["prompt_token_ids"]


def job(model: PoolingModel, body: dict[str, Any], tasks: tuple[str, ...] = TASKS) -> PoolingJob:
    return classify.translate(body, model, max_model_len=MAX_LEN, tasks=tasks)


def refused(model: PoolingModel, body: dict[str, Any], param: str, tasks: tuple[str, ...] = TASKS) -> str:
    with pytest.raises(APIError) as caught:
        job(model, body, tasks)
    assert caught.value.status == 400 and caught.value.param == param, caught.value.message
    return caught.value.message


def test_the_body_is_vllm_s_classification_response(model: PoolingModel) -> None:
    from vllm.entrypoints.pooling.classify.protocol import ClassificationResponse

    made = job(model, {"model": "tiny-classifier", "input": ["hello", "def f(): pass"], "request_id": "r1"})
    body = made.respond([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]], 9)
    assert ClassificationResponse.model_validate(body).model_dump() == body  # every key, in vLLM's names
    assert body["id"] == "classify-r1" and body["model"] == "tiny-classifier" and body["object"] == "list"
    assert [(d["index"], d["label"], d["num_classes"]) for d in body["data"]] == [(0, "code", 3), (1, "chat", 3)]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 9


def test_the_response_id_prefers_the_x_request_id_header_as_vllm(model: PoolingModel) -> None:
    made = classify.translate({"input": "a", "request_id": "body"}, model, max_model_len=MAX_LEN, tasks=TASKS,
                              request_id="header")
    assert made.respond([[1.0, 0.0, 0.0]], 3)["id"] == "classify-header"
    assert job(model, {"input": "a"}).respond([[1.0, 0.0, 0.0]], 3)["id"].startswith("classify-")


def test_the_label_is_the_first_top_class_and_none_past_the_config_s_labels(model: PoolingModel) -> None:
    body = job(model, {"input": "x"}).respond([[0.4, 0.4, 0.2]], 3)
    assert body["data"][0]["label"] == "chat"  # numpy's argmax: the first of equal ones
    assert job(model, {"input": "x"}).respond([[0.1, 0.1, 0.1, 0.7]], 3)["data"][0]["label"] is None  # as vLLM


@pytest.mark.parametrize("config", [NAMED, {"num_labels": 3}, {}, {"id2label": {"0": "LABEL_0"}},
                                    model_config(checkpoints.resolve("tiny-cross-encoder"))])
def test_labels_are_the_ones_transformers_reads(config: dict[str, Any]) -> None:
    from transformers import BertConfig

    assert labels(config) == BertConfig.from_dict(dict(config)).id2label


def test_the_checkpoint_s_facts(model: PoolingModel) -> None:
    assert dict(model.id2label) == {0: "chat", 1: "code", 2: "math"} and model.token_types and model.use_sep_token


def test_each_input_form_reaches_the_engines_as_vllm_tokenizes_it(model: PoolingModel, hf: Any) -> None:
    assert [i.token_ids for i in job(model, {"input": TEXT}).inputs] == [vllm_ids(hf, TEXT)]
    texts = [TEXT, "", "Ünïcödé and emoji 🙂"]
    assert [i.token_ids for i in job(model, {"input": texts}).inputs] == [vllm_ids(hf, t) for t in texts]
    ids = [101, 7592, 102]
    assert [i.token_ids for i in job(model, {"input": ids}).inputs] == [ids]
    assert [i.token_ids for i in job(model, {"input": [ids, ids[:2]]}).inputs] == [ids, ids[:2]]
    plain = job(model, {"input": TEXT, "add_special_tokens": False}).inputs[0].token_ids
    assert plain == vllm_ids(hf, TEXT, add_special_tokens=False)


@pytest.mark.parametrize("keep", [1, 2, 5, 9, -1])
@pytest.mark.parametrize("side", [None, "left", "right"])
def test_truncate_prompt_tokens_cuts_as_vllm_cuts(model: PoolingModel, hf: Any, keep: int, side: str | None) -> None:
    long = " ".join([TEXT] * 6)  # past MAX_LEN, so -1 cuts too
    body: dict[str, Any] = {"input": [long, "short"], "truncate_prompt_tokens": keep}
    if side is not None:
        body["truncation_side"] = side
    got = [i.token_ids for i in job(model, body).inputs]
    assert got == [vllm_ids(hf, long, keep, side), vllm_ids(hf, "short", keep, side)]
    ids = list(range(1000, 1000 + MAX_LEN + 5))
    got = job(model, {**body, "input": ids}).inputs[0].token_ids
    assert got == vllm_ids(hf, ids, keep, side)


def test_an_input_past_the_context_is_refused_naming_it_and_the_field_that_would_cut_it(model: PoolingModel) -> None:
    long = " ".join([TEXT] * 6)
    message = refused(model, {"input": ["ok", long]}, "input[1]")
    assert f"maximum context length is {MAX_LEN}" in message and "truncate_prompt_tokens" in message
    refused(model, {"input": list(range(1000, 1000 + MAX_LEN + 1))}, "input")
    assert len(job(model, {"input": list(range(1000, 1000 + MAX_LEN))}).inputs[0].token_ids) == MAX_LEN


def test_the_engine_request_is_a_classify_with_the_request_s_activation(model: PoolingModel) -> None:
    made = job(model, {"input": ["a", "b"], "use_activation": False, "priority": 3})
    assert made.task == "classify" and made.priority == 3
    assert {(i.params.task, i.params.use_activation, i.params.token_type_split) for i in made.inputs} == \
        {("classify", False, None)}
    assert job(model, {"input": "a"}).inputs[0].params.use_activation is None  # the model's default


def test_float32_values_are_written_as_vllm_writes_them(model: PoolingModel) -> None:
    from array import array

    import torch

    values = array("f", [0.1, 0.7, 0.2])  # float32, as the engine packs them
    body = job(model, {"input": "a"}).respond([values], 3)  # type: ignore[list-item]
    assert body["data"][0]["probs"] == torch.tensor([0.1, 0.7, 0.2]).tolist()  # vLLM's floats, exactly
    assert type(body["data"][0]["probs"]) is list


def test_the_writer_crosses_processes(model: PoolingModel) -> None:
    made = job(model, {"input": "a", "request_id": "r"})
    again = pickle.loads(pickle.dumps(made.respond))
    assert again([[0.2, 0.8, 0.0]], 3) == made.respond([[0.2, 0.8, 0.0]], 3)


def test_bodies_vllm_accepts_are_accepted(model: PoolingModel) -> None:
    from vllm.entrypoints.pooling.classify.protocol import ClassificationCompletionRequest

    for body in ({"input": "a"}, {"model": "m", "input": ["a", "b"], "user": "u", "truncate_prompt_tokens": -1,
                                  "truncation_side": "left", "padding": "do_not_pad", "add_special_tokens": False},
                 {"input": [[101, 102]], "use_activation": True, "request_id": "x", "priority": 0}):
        ClassificationCompletionRequest.model_validate(body)
        assert job(model, body).inputs


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": []}, "input", "must not be empty"),
    ({"input": ["a", 3]}, "input[1]", "expected a string"),
    ({"input": [[101], "a"]}, "input[1]", "list of token ids"),
    ({"input": [101, "a"]}, "input", "integers only"),
    ({"input": 3}, "input", "expected `str | array`"),
    ({"input": [101, 40000]}, "input", "out of range [0, 30522)"),
    ({"input": [[101], []]}, "input[1]", "no tokens"),
    ({"input": "", "add_special_tokens": False}, "input", "no tokens"),
    ({}, "input", "required"),
    ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "-1"),
    ({"input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens", "-1"),
    ({"input": "a", "truncate_prompt_tokens": MAX_LEN + 1}, "truncate_prompt_tokens", "max_model_len = 64"),
    ({"input": "a", "truncation_side": "middle"}, "truncation_side", "invalid enum value"),
    ({"input": "a", "normalize": True}, "normalize", "use `use_activation`"),
    ({"input": "a", "softmax": False}, "softmax", "use `use_activation`"),
    ({"input": "a", "padding": "max_length"}, "padding", "not supported"),
    ({"input": "a", "cache_salt": "s"}, "cache_salt", "not carried"),
    ({"input": "a", "mm_processor_kwargs": {}}, "mm_processor_kwargs", "text only"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "messages", "send `input`"),
    ({"input": "a", "dimensions": 3}, "dimensions", "unknown field"),
    ({"input": ["a"] * 2049}, "input", "at most 2048"),
    ({"input": ["a", "a " * 20_000]}, "input[1]", "characters"),
    ({"input": "a", "priority": 2**31}, "priority", "out of range"),
])
def test_bad_input_is_a_400_naming_the_field(model: PoolingModel, body: dict[str, Any], param: str,
                                             words: str) -> None:
    assert words in refused(model, body, param)


def test_a_model_that_does_not_classify_is_refused_naming_what_it_serves(model: PoolingModel) -> None:
    message = refused(model, {"input": "a"}, "model", tasks=("embed", "token_embed"))
    assert "does not support Classification API" in message and "pooling task is 'embed'" in message
    # vLLM classifies only when classify is the model's own task, not whenever an engine lists it.
    message = refused(model, {"input": "a"}, "model", tasks=("embed", "classify"))
    assert "pooling task is 'embed'" in message
    assert "engines serve generate" in refused(model, {"input": "a"}, "model", tasks=("generate",))


def test_a_raw_body_is_read_as_every_route_reads_one(model: PoolingModel) -> None:
    made = classify.translate(b'{"input": [101, 102.0]}', model, max_model_len=MAX_LEN, tasks=TASKS)
    assert made.inputs[0].token_ids == [101, 102]  # a whole-number float is the id, as in vLLM
    with pytest.raises(APIError) as caught:
        classify.translate(b'{"input": "a", "use_activation": NaN}', model, max_model_len=MAX_LEN, tasks=TASKS)
    assert caught.value.param == "use_activation"


def test_a_tokenizer_that_pads_by_its_file_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="no_padding"):
        PoolingModel.of("m", Tokenizer.from_file(str(CHECKPOINT / "tokenizer.json")), NAMED)
