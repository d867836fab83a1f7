"""The System One API's shapes (router process): a request body checked for its model's family, and the
answer and model-list structs, which the handler encodes and /openapi.json documents (openapi.py).
Pure: the errors are BodyError (a 400 naming the field), never HTTP."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from services.router.listeners.json_body import BodyError

# The most inputs (texts, documents) one request carries: the workers' bound (the frontend's MAX_INPUTS,
# OpenAI's bound on an embeddings call), so one request is one worker call.
MAX_INPUTS = 2048
# Each family's fields. `user` is OpenAI's end-user id for tracing: accepted, and changes nothing.
FIELDS = {"classifier": ("model", "input", "user"), "embedding": ("model", "input", "user"),
          "cross_encoder": ("model", "query", "documents", "user")}
OBJECTS = {"classifier": "systemone.classification", "embedding": "systemone.embedding",
           "cross_encoder": "systemone.scores"}


@dataclass(slots=True, frozen=True)
class SystemOneRequest:
    model: str
    family: str  # of FAMILIES
    texts: tuple[str, ...] = ()  # classifier, embedding: `input`, a lone string as a list of one
    query: str = ""  # cross_encoder
    documents: tuple[str, ...] = ()  # cross_encoder


def requested_model(body: dict[str, Any]) -> str:
    """The body's `model`, read first: which model it names decides the family whose fields it may have."""
    model = body.get("model")
    if model is None:
        raise BodyError("model: this field is required: the name of a published System One model", "model")
    if not isinstance(model, str):
        raise BodyError(f"model: expected a string, got {_kind(model)}", "model")
    return model


def read(body: dict[str, Any], family: str) -> SystemOneRequest:
    """The body as a request to a model of `family`; BodyError names the first field at fault.

    An empty text is accepted, as vLLM's /classify and /v1/embeddings accept it: the model answers it
    (a BERT tokenizer still gives its special tokens), and a worker that finds no token to pool refuses
    it with a 400 of its own, which the client gets."""
    allowed = FIELDS[family]
    for key in body:
        if key not in allowed:
            if any(key in fields for fields in FIELDS.values()):
                raise BodyError(f"{key}: not a field of a {family} model; its fields: {', '.join(allowed)}", key)
            raise BodyError(f"{key}: unknown field; a {family} model's fields: {', '.join(allowed)}", key)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BodyError(f"user: expected a string, got {_kind(user)}", "user")
    model = requested_model(body)
    if family == "cross_encoder":
        query = body.get("query")
        if not isinstance(query, str):
            raise BodyError("query: this field is required: a string" if query is None else
                            f"query: expected a string, got {_kind(query)}", "query")
        documents = _texts(body, "documents", lone=False)
        return SystemOneRequest(model, family, query=query, documents=documents)
    return SystemOneRequest(model, family, texts=_texts(body, "input", lone=True))


def _texts(body: dict[str, Any], name: str, *, lone: bool) -> tuple[str, ...]:
    """A non-empty list of at most MAX_INPUTS strings (`lone`: or one string)."""
    forms = "a string or a non-empty list of strings" if lone else "a non-empty list of strings"
    value = body.get(name)
    if value is None:
        raise BodyError(f"{name}: this field is required: {forms}", name)
    if lone and isinstance(value, str):
        return (value,)
    if not isinstance(value, list):
        raise BodyError(f"{name}: expected {forms}, got {_kind(value)}", name)
    if not value:
        raise BodyError(f"{name}: must not be empty: send {forms}", name)
    if len(value) > MAX_INPUTS:
        raise BodyError(f"{name}: {len(value)} items; at most {MAX_INPUTS} per request", name)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise BodyError(f"{name}[{i}]: expected a string, got {_kind(item)}", f"{name}[{i}]")
    return tuple(value)


def _kind(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), "null")


# ---- the documented shapes (openapi.py); answers are encoded from these structs ----

Texts = Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_INPUTS)]


class _Request(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    model: str
    user: str | None = None


class ClassifyRequest(_Request, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """To a classifier: each text's class probabilities."""
    input: str | Texts


class EmbedRequest(_Request, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """To an embedding model: each text's vector."""
    input: str | Texts


class ScoreRequest(_Request, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """To a cross-encoder: the query's relevance score against each document."""
    query: str
    documents: Texts


class SystemOneUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class SystemOneRouting(msgspec.Struct):
    """How a native recipe answered: its decision, the stage calls in order, and its budget."""
    recipe: str
    decision: str
    stages_called: list[str]
    calls: int  # model calls counted against max_calls (signals and stages)
    judge_calls: int
    deadline_s: float
    max_calls: int


# Rows and answers spell every field in their own class: a struct's fields encode in their order, and
# a base class's would come first. `stage` and `judged` are a native recipe's, left out otherwise.

class ClassifiedRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    label: str  # the most probable class
    probability: float  # its probability
    probs: dict[str, float]  # every class by name
    stage: str | None = None  # a native recipe's: the deployment whose own output this is
    judged: bool | None = None  # a native recipe's: whether its judge chose this output


class EmbeddedRow(msgspec.Struct, kw_only=True):
    index: int
    embedding: list[float]


class ScoredRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    score: float  # the document's relevance to the query (rows keep the documents' order)
    stage: str | None = None
    judged: bool | None = None


class Classification(msgspec.Struct, kw_only=True):
    object: Literal["systemone.classification"] = "systemone.classification"
    model: str
    family: Literal["classifier"] = "classifier"
    data: list[ClassifiedRow]
    usage: SystemOneUsage
    deployment: str  # the deployment that answered; a native recipe's: the stage of its first row
    routing: SystemOneRouting | None = None  # a native recipe's; null for a concrete model


class Embedding(msgspec.Struct, kw_only=True):
    object: Literal["systemone.embedding"] = "systemone.embedding"
    model: str
    family: Literal["embedding"] = "embedding"
    data: list[EmbeddedRow]
    usage: SystemOneUsage
    deployment: str
    routing: SystemOneRouting | None = None  # always null: an embedding model has no confidence to escalate on


class Scores(msgspec.Struct, kw_only=True):
    object: Literal["systemone.scores"] = "systemone.scores"
    model: str
    family: Literal["cross_encoder"] = "cross_encoder"
    data: list[ScoredRow]
    usage: SystemOneUsage
    deployment: str
    routing: SystemOneRouting | None = None


Family = Literal["classifier", "embedding", "cross_encoder"]  # config.FAMILIES


class SystemOneModel(msgspec.Struct):
    id: str
    family: Family
    routing: bool  # true: a native recipe (stages escalated); false: a concrete model (one deployment)
    created: int
    object: Literal["model"] = "model"
    owned_by: str = "router"


class SystemOneModelList(msgspec.Struct):
    data: list[SystemOneModel]
    object: Literal["list"] = "list"


REQUESTS: dict[str, type[_Request]] = {"classifier": ClassifyRequest, "embedding": EmbedRequest,
                                       "cross_encoder": ScoreRequest}
ANSWERS: dict[str, type[Classification | Embedding | Scores]] = {
    "classifier": Classification, "embedding": Embedding, "cross_encoder": Scores}
