"""The System One API of the router's listeners (router process): POST /v1/systemone (and its alias
/v1/decisions) answers a published decision model's output, GET /v1/systemone/models lists them.

A published name is a deployment (a concrete model: one call to one of its workers through the model
runtime) or a native recipe (an entry with `api: systemone`: decision/native.py runs its stages). Names
a listener does not publish answer the 404 an unknown name gets, so a client cannot tell them apart.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

import msgspec

from services.router.config import EntryConfig, RouterConfig
from services.router.decision import native
from services.router.decision.native import NativeInput, RecipeResult
from services.router.errors import HTTPError
from services.router.listeners import systemone_schema as schema
from services.router.listeners.json_body import BodyError, decode_object
from services.router.runtime.models import Label, ModelUnavailable

if TYPE_CHECKING:
    from services.router.decision.engine import Router
    from services.router.decision.judge import JudgeCaller
    from services.router.listeners.listener import Listener
    from services.router.runtime.deployments import Deployments

POST_PATHS = ("/v1/systemone", "/v1/decisions")  # /v1/decisions: the alias (the explain route moved away)
MODELS_PATH = "/v1/systemone/models"
_json = msgspec.json.Encoder()


class SystemOne:
    """The API over one config: which published name is what, and its answers."""

    def __init__(self, config: RouterConfig, created: int) -> None:
        self.config = config
        self.created = created  # every card's `created`: when this router started, as /v1/models says

    def family(self, name: str) -> str | None:
        return self.config.family_of(name)

    def _native(self, name: str) -> bool:
        entry = self.config.entries.get(name)
        return entry is not None and entry.native

    def models(self, listener: Listener) -> bytes:
        cards = []
        for name in listener.config.systemone:
            family = self.family(name)
            if family is not None:
                cards.append(schema.SystemOneModel(id=name, family=cast(schema.Family, family),
                                              routing=self._native(name), created=self.created))
        return _json.encode(schema.SystemOneModelList(data=cards))

    def resolve(self, listener: Listener, raw: bytes) -> schema.SystemOneRequest:
        """The body read for the published model it names: 400 naming the field, 404 for a name this
        listener does not publish (the same body as for a name nothing declares)."""
        try:
            body = decode_object(raw)
            model = schema.requested_model(body)
            published = listener.config.systemone
            family = self.family(model) if model in published else None
            if family is None:
                raise HTTPError(404, f"The model `{model}` does not exist; available: {', '.join(published)}",
                                param="model")
            return schema.read(body, family)
        except BodyError as exc:
            raise HTTPError(400, exc.message, param=exc.param or None) from None

    async def answer(self, request: schema.SystemOneRequest, *, runtime: Deployments | None, router: Router,
                     judge: JudgeCaller | None, offload: bool = False) -> bytes:
        """The answer's body; HTTPError with the status of a call that could not be answered. `offload`:
        a long request, whose recipe counts tokens in a thread (as a long chat request's)."""
        try:
            entry = self.config.entries.get(request.model)
            if entry is not None and entry.native:  # as RouterConfig.family_of reads a name: a recipe first
                return await self._recipe(entry, request, runtime, router, judge, offload)
            if runtime is None:
                raise ModelUnavailable(f"deployment {request.model!r}: this router runs no model runtime")
            return await concrete(runtime, request)
        except ModelUnavailable as exc:
            retry = [] if exc.retry_after_s is None else [(b"retry-after", str(exc.retry_after_s).encode())]
            raise HTTPError(exc.status, exc.public_message, param=exc.param, headers=retry) from None

    async def _recipe(self, entry: EntryConfig, request: schema.SystemOneRequest, runtime: Deployments | None,
                      router: Router, judge: JudgeCaller | None, offload: bool) -> bytes:
        if runtime is None:
            raise ModelUnavailable(f"recipe {entry.name!r}: this router runs no model runtime")
        inp = NativeInput(request.family, texts=request.texts, query=request.query, documents=request.documents)
        result = await native.run(entry, inp, router=router, models=runtime, judge=judge, offload=offload)
        return _json.encode(recipe_answer(entry.name, request.family, result))


async def concrete(runtime: Deployments, request: schema.SystemOneRequest) -> bytes:
    """A deployment's answer: one call within its own timeout_s, the input never cut (a text past the
    model's context is the worker's 400)."""
    name = request.model
    timeout_s = runtime.config.deployments[name].timeout_s
    usage = schema.SystemOneUsage
    if request.family == "classifier":
        classified = await runtime.classify(name, list(request.texts), timeout_s=timeout_s, truncate=False)
        tokens = classified.prompt_tokens
        return _json.encode(schema.Classification(
            model=name, data=[_classified(i, label) for i, label in enumerate(classified.results)],
            usage=usage(tokens, tokens), deployment=name))
    if request.family == "embedding":
        embedded = await runtime.embed(name, list(request.texts), timeout_s=timeout_s, truncate=False)
        tokens = embedded.prompt_tokens
        return _json.encode(schema.Embedding(
            model=name, data=[schema.EmbeddedRow(index=i, embedding=v) for i, v in enumerate(embedded.vectors)],
            usage=usage(tokens, tokens), deployment=name))
    reranked = await runtime.rerank(name, request.query, list(request.documents), timeout_s=timeout_s, truncate=False)
    tokens = reranked.prompt_tokens
    return _json.encode(schema.Scores(
        model=name, data=[schema.ScoredRow(index=i, score=s) for i, s in enumerate(reranked.scores)],
        usage=usage(tokens, tokens), deployment=name))


def recipe_answer(recipe: str, family: str, result: RecipeResult) -> schema.Classification | schema.Scores:
    """A native recipe's result as the API answers it: each row is the output of the stage it names
    (`judged`: its judge chose it), `deployment` the first row's stage, `routing` how it ran."""
    # `decision`: added to RecipeResult by the recipe runner (decision/native.py), "" until then.
    routing = schema.SystemOneRouting(recipe=recipe, decision=result.decision,
                             stages_called=list(result.stages_called), calls=result.calls,
                             judge_calls=result.judge_calls, deadline_s=result.deadline_s, max_calls=result.max_calls)
    usage = schema.SystemOneUsage(result.prompt_tokens, result.prompt_tokens)
    first = result.items[0].chosen.stage if result.items else ""
    if family == "classifier":
        rows = []
        for i, item in enumerate(result.items):
            output = item.chosen.output
            assert isinstance(output, Label)  # a classifier recipe's stages are classifiers (the config reader)
            rows.append(_classified(i, output, stage=item.chosen.stage, judged=item.judge == "chose"))
        return schema.Classification(model=recipe, data=rows, usage=usage, deployment=first, routing=routing)
    # A cross-encoder recipe answers its one input (the query against every document) with one stage's scores.
    [item] = result.items
    scores = item.chosen.output
    assert isinstance(scores, tuple)
    judged = item.judge == "chose"
    return schema.Scores(model=recipe, data=[schema.ScoredRow(index=i, score=s, stage=item.chosen.stage, judged=judged)
                                             for i, s in enumerate(scores)],
                         usage=usage, deployment=first, routing=routing)


def _classified(index: int, label: Label, *, stage: str | None = None,
                judged: bool | None = None) -> schema.ClassifiedRow:
    return schema.ClassifiedRow(index=index, label=label.label, probability=label.probability, probs=label.probs,
                                stage=stage, judged=judged)
