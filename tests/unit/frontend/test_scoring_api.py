"""POST /score and /rerank's translators (services/frontend/requests/scoring.py, prompt_encoding.py):
pairs encoded as vLLM's cross-encoder encodes them (its own get_score_prompt and token-type
compression), bi-encoder cosines and the response bodies as vLLM's serving code builds them from the
same pooled outputs, rerank order and top_n, and every refusal a 400 naming the field."""
from __future__ import annotations

import json
import math
import pickle
import types
from typing import Any

import pytest
from tokenizers import Tokenizer

import checkpoints
from prompting.model_files import model_config
from services.frontend.errors import APIError
from services.frontend.requests import scoring
from services.frontend.requests.pooling_job import PoolingJob
from services.frontend.requests.pooling_model import PoolingModel

CROSS = checkpoints.resolve("tiny-cross-encoder")  # one label, random BERT weights, MiniLM's tokenizer
MINILM = checkpoints.resolve("minilm")
MAX_LEN = 48
CROSS_TASKS = ("classify", "token_classify")  # a sequence classifier's engines
EMBED_TASKS = ("embed", "token_embed")  # an embedding model's
QUERY = "what is the capital city of france"
DOCS = ["paris is the capital and largest city of france", "the eiffel tower", "bananas are yellow"]


def bare_tokenizer(path: Any = CROSS) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_truncation()  # as the frontend must load it (test_classify_api.py says why)
    tokenizer.no_padding()
    return tokenizer


@pytest.fixture(scope="module")
def cross() -> PoolingModel:
    return PoolingModel.of("tiny-cross-encoder", bare_tokenizer(), model_config(CROSS))


@pytest.fixture(scope="module")
def embedder() -> PoolingModel:
    return PoolingModel.of("minilm", bare_tokenizer(MINILM), model_config(MINILM))


@pytest.fixture(scope="module")
def hf() -> Any:
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(CROSS), runner_type="pooling")


@pytest.fixture(scope="module")
def vllm_cross(hf: Any) -> Any:
    """vLLM's CrossEncoderIOProcessor for a BERT cross-encoder, without the engine it never calls here."""
    from vllm.entrypoints.pooling.scoring.io_processor import CrossEncoderIOProcessor

    proc = CrossEncoderIOProcessor.__new__(CrossEncoderIOProcessor)
    proc.tokenizer, proc.supports_score_template, proc.model, proc.use_sep_token = hf, False, None, True
    proc.model_config = types.SimpleNamespace(is_multimodal_model=False, enable_prompt_embeds=False,
                                              multimodal_config=None)
    return proc


def vllm_pair(hf: Any, proc: Any, first: str, second: str, keep: int | None = None, side: str | None = None,
              per_query: int = 0, per_doc: int = 0) -> tuple[list[int], int]:
    """A pair's token ids and compressed token type ids as vLLM's cross-encoder render makes them."""
    from vllm.entrypoints.pooling.scoring.io_processor import _apply_post_tokenization_to_token_type_ids
    from vllm.entrypoints.pooling.scoring.utils import compress_token_type_ids
    from vllm.renderers import TokenizeParams

    params = TokenizeParams(max_total_tokens=MAX_LEN, max_output_tokens=0, truncate_prompt_tokens=keep,
                            truncation_side=side, add_special_tokens=True)
    _, prompt = proc.get_score_prompt(first, second, params.get_encode_kwargs(), max_tokens_per_query=per_query,
                                      max_tokens_per_doc=per_doc)
    params.apply_post_tokenization(hf, prompt)
    type_ids = _apply_post_tokenization_to_token_type_ids(hf, params, prompt.pop("token_type_ids"))
    return prompt["prompt_token_ids"], compress_token_type_ids(type_ids)


def vllm_outputs(values: list[list[float]]) -> list[Any]:
    import torch
    from vllm.outputs import PoolingOutput, PoolingRequestOutput

    return [PoolingRequestOutput(f"r{i}", PoolingOutput(torch.tensor(v)), [101, 102], 0, True)
            for i, v in enumerate(values)]


def vllm_body(response: Any) -> dict[str, Any]:
    return json.loads(response.body)


def score(model: PoolingModel, body: dict[str, Any], tasks: tuple[str, ...] = CROSS_TASKS) -> PoolingJob:
    return scoring.translate_score(body, model, max_model_len=MAX_LEN, tasks=tasks)


def rerank(model: PoolingModel, body: dict[str, Any], tasks: tuple[str, ...] = CROSS_TASKS) -> PoolingJob:
    return scoring.translate_rerank(body, model, max_model_len=MAX_LEN, tasks=tasks)


def refused(call: Any, model: PoolingModel, body: dict[str, Any], param: str,
            tasks: tuple[str, ...] = CROSS_TASKS) -> str:
    with pytest.raises(APIError) as caught:
        call(model, body, tasks)
    assert caught.value.status == 400 and caught.value.param == param, caught.value.message
    return caught.value.message


# ---- what reaches the engines ----

def test_a_pair_reaches_the_engine_as_vllm_s_cross_encoder_encodes_it(cross: PoolingModel, hf: Any,
                                                                      vllm_cross: Any) -> None:
    made = score(cross, {"queries": QUERY, "documents": DOCS})
    assert made.task == "classify" and len(made.inputs) == len(DOCS)  # 1:N: the query in each pair
    for doc, sent in zip(DOCS, made.inputs, strict=True):
        ids, split = vllm_pair(hf, vllm_cross, QUERY, doc)
        assert (sent.token_ids, sent.params.token_type_split) == (ids, split)
        assert sent.params.task == "classify" and sent.params.use_activation is None


@pytest.mark.parametrize("keep", [1, 2, 3, 4, 5, 8, 13, 20, -1])
@pytest.mark.parametrize("side", [None, "left", "right"])
@pytest.mark.parametrize(("first", "second"), [(QUERY, DOCS[0]), (DOCS[0], "eiffel"), ("a b", "c d"),
                                               (" ".join([QUERY] * 5), " ".join(DOCS * 3))])
def test_truncation_of_a_pair_is_vllm_s(cross: PoolingModel, hf: Any, vllm_cross: Any, keep: int,
                                        side: str | None, first: str, second: str) -> None:
    body: dict[str, Any] = {"text_1": first, "text_2": second, "truncate_prompt_tokens": keep}
    if side is not None:
        body["truncation_side"] = side
    sent = score(cross, body).inputs[0]
    assert (sent.token_ids, sent.params.token_type_split) == vllm_pair(hf, vllm_cross, first, second, keep, side)


@pytest.mark.parametrize(("per_query", "per_doc"), [(0, 3), (2, 0), (4, 6), (8, 3), (1, 1), (40, 40)])
@pytest.mark.parametrize(("keep", "side"), [(None, None), (12, None), (-1, None), (12, "left"), (9, "right")])
def test_per_text_limits_cut_as_vllm_cuts(cross: PoolingModel, hf: Any, vllm_cross: Any, per_query: int,
                                          per_doc: int, keep: int | None, side: str | None) -> None:
    query, doc = "unbelievably long-winded questions, asked twice", " ".join(DOCS)
    body: dict[str, Any] = {"query": query, "documents": [doc, "tiny"], "max_tokens_per_query": per_query,
                            "max_tokens_per_doc": per_doc, "truncate_prompt_tokens": keep, "truncation_side": side}
    try:
        theirs = [vllm_pair(hf, vllm_cross, query, d, keep, side, per_query, per_doc) for d in (doc, "tiny")]
    except Exception as exc:  # the tokenizer's own error, a 500 at vLLM: the query alone is past the cut
        assert "Truncation error" in str(exc)
        assert "only the document is cut" in refused(rerank, cross, body, "truncate_prompt_tokens")
        return
    assert [(i.token_ids, i.params.token_type_split) for i in rerank(cross, body).inputs] == theirs


def test_per_text_limits_cut_each_text_of_a_bi_encoder_as_vllm_cuts(embedder: PoolingModel, hf: Any) -> None:
    from vllm.entrypoints.pooling.scoring.utils import truncate_text_to_tokens

    texts = ["unbelievably long-winded questions", "Ünïcödé, emoji 🙂 and more words", "ok"]
    made = score(embedder, {"queries": texts[0], "documents": texts[1:], "max_tokens_per_query": 3,
                            "max_tokens_per_doc": 4}, tasks=EMBED_TASKS)
    limits = [3, 4, 4]
    assert [i.token_ids for i in made.inputs] == [hf(truncate_text_to_tokens(t, hf, n))["input_ids"]
                                                  for t, n in zip(texts, limits, strict=True)]


def test_a_query_longer_than_truncation_allows_with_a_document_limit_is_refused(cross: PoolingModel) -> None:
    body = {"query": QUERY, "documents": "a b c", "max_tokens_per_doc": 2, "truncate_prompt_tokens": 5}
    assert "only the document is cut" in refused(rerank, cross, body, "truncate_prompt_tokens")


def test_a_pair_past_the_context_is_refused_naming_the_document(cross: PoolingModel) -> None:
    long = " ".join(DOCS * 4)
    message = refused(score, cross, {"queries": QUERY, "documents": [DOCS[0], long]}, "documents[1]")
    assert f"maximum context length is {MAX_LEN}" in message and "truncate_prompt_tokens" in message
    assert len(score(cross, {"queries": QUERY, "documents": long, "truncate_prompt_tokens": -1})
               .inputs[0].token_ids) == MAX_LEN


def test_n_to_n_pairs_each_query_with_its_document(cross: PoolingModel, hf: Any, vllm_cross: Any) -> None:
    queries = ["q one", "q two", "q three"]
    made = score(cross, {"data_1": queries, "data_2": DOCS})
    assert [i.token_ids for i in made.inputs] == [vllm_pair(hf, vllm_cross, q, d)[0]
                                                  for q, d in zip(queries, DOCS, strict=True)]


def test_a_bi_encoder_embeds_each_text_once_queries_first(embedder: PoolingModel, hf: Any) -> None:
    made = score(embedder, {"queries": QUERY, "documents": DOCS, "use_activation": False}, tasks=EMBED_TASKS)
    assert made.task == "embed"
    assert [i.token_ids for i in made.inputs] == [hf(t)["input_ids"] for t in [QUERY, *DOCS]]
    assert {(i.params.task, i.params.use_activation, i.params.token_type_split) for i in made.inputs} == \
        {("embed", False, None)}


def test_an_embedding_model_serving_classify_too_scores_by_embeddings_as_vllm_picks(cross: PoolingModel) -> None:
    assert score(cross, {"text_1": "a", "text_2": "b"}, tasks=("classify", "embed")).task == "embed"


def test_a_model_without_separators_scores_the_texts_joined(hf: Any) -> None:
    joined = PoolingModel("llm-reranker", bare_tokenizer(), {0: "yes"}, token_types=False, use_sep_token=False)
    sent = score(joined, {"text_1": "abc ", "text_2": "def"}).inputs[0]
    assert (sent.token_ids, sent.params.token_type_split) == (hf("abc def")["input_ids"], None)


@pytest.mark.parametrize("names", scoring.SIDES)
def test_every_name_vllm_gives_the_two_sides_is_read(cross: PoolingModel, names: tuple[str, str]) -> None:
    from pydantic import TypeAdapter
    from vllm.entrypoints.pooling.scoring.protocol import ScoreRequest

    body = {names[0]: QUERY, names[1]: DOCS}
    TypeAdapter(ScoreRequest).validate_python(body)  # vLLM reads it too
    assert len(score(cross, body).inputs) == len(DOCS)


# ---- what comes back ----

def test_the_score_body_is_the_one_vllm_builds_from_the_same_outputs(cross: PoolingModel) -> None:
    from vllm.entrypoints.pooling.scoring.protocol import ScoreResponse
    from vllm.entrypoints.pooling.scoring.serving import ServingScores

    made = score(cross, {"queries": QUERY, "documents": DOCS, "request_id": "r7"})
    pooled = [[0.25], [0.875], [0.0625]]
    body = made.respond(pooled, 30)
    assert ScoreResponse.model_validate(body).model_dump() == body
    theirs = vllm_body(ServingScores._request_output_to_score_response(
        None, vllm_outputs(pooled), "score-r7", body["created"], "tiny-cross-encoder", 30))
    assert body == theirs


def test_bi_encoder_scores_are_vllm_s_cosines(embedder: PoolingModel) -> None:
    from vllm.entrypoints.pooling.scoring.io_processor import BiEncoderIOProcessor

    proc = BiEncoderIOProcessor.__new__(BiEncoderIOProcessor)
    proc.pad_token_id = 0
    embeddings = [[0.6, 0.8, 0.0], [0.6, 0.8, 0.0], [0.0, 0.0, 2.0], [-1.0, 1.0, 0.5], [0.0, 0.0, 0.0]]
    theirs = [float(out.outputs) for out in proc._post_process(vllm_outputs(embeddings), n_queries=1)]
    made = score(embedder, {"queries": "q", "documents": ["a", "b", "c", "d"]}, tasks=EMBED_TASKS)
    ours = [d["score"] for d in made.respond(embeddings, 12)["data"]]
    assert ours == pytest.approx(theirs, abs=1e-6) and ours[3] == 0.0  # a zero vector scores 0, not NaN
    pairs = score(embedder, {"queries": ["a", "b"], "documents": ["c", "d"]}, tasks=EMBED_TASKS)
    theirs = [float(out.outputs) for out in proc._post_process(vllm_outputs(embeddings[:4]), n_queries=2)]
    assert [d["score"] for d in pairs.respond(embeddings[:4], 8)["data"]] == pytest.approx(theirs, abs=1e-6)


@pytest.mark.parametrize("top_n", [0, 1, 2, 3, 7])
def test_rerank_is_vllm_s_order_and_top_n(cross: PoolingModel, top_n: int) -> None:
    from vllm.entrypoints.pooling.scoring.protocol import RerankResponse
    from vllm.entrypoints.pooling.scoring.serving import ServingScores

    docs = DOCS + ["a tie with the second"]
    made = rerank(cross, {"query": QUERY, "documents": docs, "top_n": top_n, "request_id": "r1"})
    pooled = [[0.5], [0.75], [0.125], [0.75]]
    body = made.respond(pooled, 40)
    assert RerankResponse.model_validate(body).model_dump() == body
    theirs = vllm_body(ServingScores._request_output_to_rerank_response(
        None, vllm_outputs(pooled), "score-r1", "tiny-cross-encoder", docs,
        top_n if top_n > 0 else len(pooled), 40))
    assert body == theirs
    assert [r["index"] for r in body["results"]][:3] == [1, 3, 0][:top_n or 3]  # ties keep the order sent


def test_the_response_ids_prefer_the_x_request_id_header_as_vllm(cross: PoolingModel) -> None:
    for translate in (scoring.translate_score, scoring.translate_rerank):
        body = {"text_1": "q", "text_2": "a", "request_id": "body"} if translate is scoring.translate_score \
            else {"query": "q", "documents": "a", "request_id": "body"}
        made = translate(body, cross, max_model_len=MAX_LEN, tasks=CROSS_TASKS, request_id="header")
        assert made.respond([[0.5]], 4)["id"] == "score-header"  # vLLM's prefix for both routes


def test_return_documents_false_leaves_the_documents_out(cross: PoolingModel) -> None:
    body = rerank(cross, {"query": QUERY, "documents": DOCS, "return_documents": False}).respond([[0.1], [0.3],
                                                                                                [0.2]], 9)
    assert body["results"] == [{"index": 1, "relevance_score": 0.3}, {"index": 2, "relevance_score": 0.2},
                               {"index": 0, "relevance_score": 0.1}]


def test_a_single_document_string_is_one_document(cross: PoolingModel) -> None:
    made = rerank(cross, {"query": QUERY, "documents": DOCS[0]})
    assert len(made.inputs) == 1
    assert made.respond([[0.9]], 5)["results"][0]["document"] == {"text": DOCS[0], "multi_modal": None}


def test_the_writers_cross_processes(cross: PoolingModel, embedder: PoolingModel) -> None:
    for made, pooled in ((rerank(cross, {"query": "q", "documents": ["a", "b"]}), [[0.1], [0.2]]),
                         (score(embedder, {"text_1": "q", "text_2": "a"}, EMBED_TASKS), [[1.0, 0.0], [0.0, 1.0]])):
        again = pickle.loads(pickle.dumps(made.respond))
        assert again(pooled, 4) == made.respond(pooled, 4)


def test_a_cross_encoder_output_of_more_than_one_value_is_an_error_not_a_score(cross: PoolingModel) -> None:
    with pytest.raises(ValueError, match="one value"):
        score(cross, {"text_1": "q", "text_2": "a"}).respond([[0.1, 0.9]], 4)
    assert math.isclose(score(cross, {"text_1": "q", "text_2": "a"}).respond([[0.1]], 4)["data"][0]["score"], 0.1)


# ---- refusals ----

@pytest.mark.parametrize(("body", "param", "words"), [
    ({"queries": QUERY}, "queries", "one pair of names"),
    ({"queries": QUERY, "text_2": DOCS}, "queries", "the body has queries, text_2"),
    ({"queries": QUERY, "documents": DOCS, "items": DOCS}, "queries", "one pair of names"),
    ({}, "queries", "none of them"),
    ({"queries": ["a", "b"], "documents": DOCS}, "documents", "1:1, 1:N or N:N"),
    ({"queries": [], "documents": DOCS}, "queries", "at least one"),
    ({"queries": QUERY, "documents": []}, "documents", "at least one"),
    ({"queries": QUERY, "documents": ["a", {"content": []}]}, "documents[1]", "text only"),
    ({"queries": {"content": []}, "documents": "a"}, "queries", "text only"),
    ({"queries": QUERY, "documents": ["a"] * 2049}, "documents", "at most 2048"),
    ({"queries": QUERY, "documents": "a", "max_tokens_per_query": -1}, "max_tokens_per_query", "non-negative"),
    ({"queries": QUERY, "documents": "a", "max_tokens_per_doc": MAX_LEN}, "max_tokens_per_doc", "less than"),
    ({"queries": QUERY, "documents": "a", "instruction": "be strict"}, "instruction", "score templates"),
    ({"queries": QUERY, "documents": "a", "top_n": 2}, "top_n", "unknown field"),
])
def test_bad_score_bodies_are_400s_naming_the_field(cross: PoolingModel, body: dict[str, Any], param: str,
                                                    words: str) -> None:
    assert words in refused(score, cross, body, param)


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n", ">= 0"),
    ({"query": [QUERY], "documents": DOCS}, "query", "a string"),
    ({"documents": DOCS}, "query", "required"),
    ({"query": QUERY}, "documents", "required"),
    ({"query": QUERY, "documents": []}, "documents", "at least one"),
    ({"query": QUERY, "documents": [{"text": "a"}]}, "documents[0]", "text only"),
    ({"query": QUERY, "documents": DOCS, "return_documents": "yes"}, "return_documents", "expected `bool"),
    ({"query": QUERY, "documents": DOCS, "normalize": True}, "normalize", "use_activation"),
])
def test_bad_rerank_bodies_are_400s_naming_the_field(cross: PoolingModel, body: dict[str, Any], param: str,
                                                     words: str) -> None:
    assert words in refused(rerank, cross, body, param)


def test_a_model_that_cannot_score_is_refused_in_vllm_s_words(cross: PoolingModel) -> None:
    named = PoolingModel.of("clf", bare_tokenizer(), {"id2label": {"0": "a", "1": "b", "2": "c"}})
    message = refused(score, named, {"text_1": "a", "text_2": "b"}, "model")
    assert "does not support Score API" in message and "has 3" in message
    message = refused(rerank, cross, {"query": "a", "documents": "b"}, "model", tasks=("generate",))
    assert "does not support Rerank (Score) API" in message and "generate" in message
    assert "late interaction" in refused(score, cross, {"text_1": "a", "text_2": "b"}, "model",
                                         tasks=("token_embed",))


# ---- bounds on the work one call makes ----

class CountingTokenizer:
    """The tokenizer, counting the characters it is given to tokenize."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.chars = tokenizer, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def encode(self, text: Any, *args: Any, **kw: Any) -> Any:
        self.chars += len(text) if isinstance(text, str) else sum(map(len, text))
        return self.tokenizer.encode(text, *args, **kw)

    def encode_batch(self, texts: list[Any], *args: Any, **kw: Any) -> Any:
        self.chars += sum(len(t) if isinstance(t, str) else sum(map(len, t)) for t in texts)
        return self.tokenizer.encode_batch(texts, *args, **kw)


def test_a_cross_encoder_tokenizes_the_query_once_and_each_document_once(hf: Any) -> None:
    counting = CountingTokenizer(bare_tokenizer())
    model = PoolingModel("tiny-cross-encoder", counting, {0: "score"}, token_types=True)  # type: ignore[arg-type]
    docs = [*DOCS, "Ünïcödé, emoji 🙂 and more words"]
    made = score(model, {"queries": QUERY, "documents": docs})
    assert counting.chars == len(QUERY) + sum(map(len, docs))
    for doc, sent in zip(docs, made.inputs, strict=True):  # the same ids and type split as the pair encoding
        whole = bare_tokenizer().encode(QUERY, doc)
        assert (sent.token_ids, sent.params.token_type_split) == (whole.ids, whole.type_ids.index(1))


def test_a_query_past_the_context_is_refused_before_any_document_is_tokenized(cross: PoolingModel) -> None:
    counting = CountingTokenizer(bare_tokenizer())
    model = PoolingModel("tiny-cross-encoder", counting, {0: "score"}, token_types=True)  # type: ignore[arg-type]
    long = " ".join([QUERY] * 10)
    message = refused(rerank, model, {"query": long, "documents": ["short doc"] * 50}, "query")
    assert "query alone" in message and counting.chars == len(long)


def test_a_text_past_the_character_bound_is_refused_untokenized_or_precut(cross: PoolingModel) -> None:
    from services.frontend.requests.prompt_encoding import max_chars_per_token

    counting = CountingTokenizer(bare_tokenizer())
    model = PoolingModel("tiny-cross-encoder", counting, {0: "score"}, token_types=True)  # type: ignore[arg-type]
    limit = MAX_LEN * max_chars_per_token(bare_tokenizer())
    huge = "a " * limit
    message = refused(score, model, {"queries": QUERY, "documents": ["b", huge]}, "documents[1]")
    assert f"more than {limit} characters" in message and counting.chars == 0
    made = score(model, {"queries": QUERY, "documents": huge, "truncate_prompt_tokens": -1})
    assert len(made.inputs[0].token_ids) == MAX_LEN and counting.chars <= 2 * (len(QUERY) + limit)


@pytest.mark.parametrize(("tasks", "sides", "ok"), [
    (EMBED_TASKS, (1, 2047), True), (EMBED_TASKS, (1, 2048), False), (EMBED_TASKS, (2048, 2048), False),
    (CROSS_TASKS, (1, 2048), True), (CROSS_TASKS, (2048, 2048), True), (CROSS_TASKS, (1, 2049), False),
])
def test_the_input_bound_counts_engine_requests_not_texts_a_side(cross: PoolingModel, tasks: tuple[str, ...],
                                                                 sides: tuple[int, int], ok: bool) -> None:
    body = {"queries": ["q"] * sides[0], "documents": ["d"] * sides[1]}
    if ok:
        assert len(score(cross, body, tasks).inputs) == sides[1] + (sides[0] if tasks == EMBED_TASKS else 0)
    else:
        assert "at most 2048" in refused(score, cross, body, "documents", tasks)
