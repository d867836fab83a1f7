"""Precise prefix policy (router process): a request is rendered and tokenized as the frontend does
(prompt_ids.py), hashed into the engines' chained blocks (protocol.block_hash), and goes to the replica
whose engines report holding the longest leading run of them (kv_blocks.py, fed by each frontend's
KvEvents stream); with cache_aware's fallbacks on load: imbalance first, then a weak match. A prompt
just sent counts as held where it went for a few seconds, until its engine has reported it."""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.block_hash import block_hashes
from services.router.backends.kv_blocks import ReplicaBlocks
from services.router.backends.policies.load import imbalance
from services.router.backends.policies.load import least_loaded as _least_loaded
from services.router.backends.prompt_ids import PromptModel, Unrenderable
from services.router.backends.replica import Replica

log = logging.getLogger("router")

# Bodies up to this are tokenized and hashed on the loop (~3 us a token: ~12 ms at most); longer ones in a
# thread. The thread is not free: each GIL hand-back to it waits on the busy loop (switch interval), which
# cost ~70 ms of TTFT p50 at bench/router_cache.py's 9 kB prompts (+2 ms inline, beside cache_aware's).
INLINE_BYTES = 16 * 1024


@dataclass(slots=True, frozen=True)
class Prompt:
    """What `prepare` made of a request: its block hashes, or why there are none."""
    hashes: tuple[int, ...] = ()
    tokens: int = 0
    reason: str = ""  # set when there are no hashes to score by


def _hashed(model: PromptModel, body: dict[str, Any], block_size: int, lora: str | None) -> Prompt:
    try:
        prompt = model.prompt_now(body)
    except Unrenderable as exc:
        return Prompt(reason=f"not tokenized: {exc}")
    hashes = block_hashes(prompt.ids, block_size, salt=prompt.salt, lora=lora)
    if not hashes:
        return Prompt(tokens=len(prompt.ids), reason=f"{len(prompt.ids)} tokens: no full block")
    return Prompt(tuple(hashes), len(prompt.ids))



class PrecisePrefix:
    reads_body = True  # it renders and tokenizes the messages

    def __init__(self, *, cache_threshold: float = 0.5, balance_abs: int = 16, balance_rel: float = 1.5,
                 pending_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold!r}")
        if balance_abs < 0:
            raise ValueError(f"balance_abs must be >= 0, got {balance_abs!r}")
        if balance_rel < 1.0:
            raise ValueError(f"balance_rel must be >= 1, got {balance_rel!r}")
        if not pending_s >= 0:
            raise ValueError(f"pending_s must be >= 0, got {pending_s!r}")
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.pending_s = pending_s
        self._clock = clock
        # Blocks of prompts sent and not yet reported: by replica URL, hash -> until when it counts; and
        # the same in the order they expire.
        self._pending: dict[str, dict[int, float]] = {}
        self._expiry: deque[tuple[float, str, tuple[int, ...]]] = deque()
        self.model: PromptModel | None = None  # loaded before the first request (Router.load_models)
        self.block_size: int | None = None  # the engines' (GetModelInfo, or a stored event)
        # The pool's `model` (sent upstream) and the replicas' base model (GetModelInfo): a pool whose
        # model is another name serves a LoRA adapter, whose blocks the engines chain from its own root.
        self.upstream_model: str | None = None
        self.served_model: str | None = None
        self.replicas: dict[str, ReplicaBlocks] = {}  # by replica URL; kv_events.py keeps them current
        self.last_reason = ""
        self.last_match = 0.0  # fraction of the latest chosen request's blocks its replica holds

    def blocks(self, url: str) -> ReplicaBlocks:
        held = self.replicas.get(url)
        if held is None:
            held = self.replicas[url] = ReplicaBlocks()
        return held

    def learn_block_size(self, size: int, source: str) -> None:
        if size <= 0 or size == self.block_size:
            return
        if self.block_size is not None:
            log.warning("precise_prefix: %s reports block size %d, not %d as before: hashing with %d from now on",
                        source, size, self.block_size, size)
        self.block_size = size

    @property
    def lora(self) -> str | None:
        """The LoRA adapter this pool's requests run with, as the frontends read `model`: a name other than
        the base model's."""
        up, served = self.upstream_model, self.served_model
        return up if up and served and up != served else None

    def learn_served_model(self, name: str, source: str) -> None:
        if not name or name == self.served_model:
            return
        if self.served_model is not None:
            log.warning("precise_prefix: %s serves base model %r, not %r as before", source, name, self.served_model)
        self.served_model = name

    async def prepare(self, body: dict[str, Any], size: int) -> Prompt:
        if self.model is None:
            return Prompt(reason="no tokenizer loaded")
        if self.block_size is None:
            return Prompt(reason="block size not known yet (no KvEvents stream has said it)")
        if size <= INLINE_BYTES:
            return _hashed(self.model, body, self.block_size, self.lora)
        # Long: in a thread, as minijinja and encode_batch_fast release the GIL, the loop serves other
        # requests meanwhile.
        return await asyncio.to_thread(_hashed, self.model, body, self.block_size, self.lora)

    def choose(self, candidates: list[Replica], request_bytes: int, text: str | None,
               prepared: object = None) -> Replica:
        self.last_match = 0.0
        skew = imbalance(candidates, self.balance_abs, self.balance_rel)
        if skew is not None:
            best = min(candidates, key=_least_loaded)
            self.last_reason = (f"precise_prefix: imbalanced (in-flight max {skew[0]}, min {skew[1]}) "
                                f"-> least loaded {best.url}")
            return best
        if not isinstance(prepared, Prompt) or not prepared.hashes:
            why = prepared.reason if isinstance(prepared, Prompt) else "nothing prepared"
            best = min(candidates, key=_least_loaded)
            self.last_reason = f"precise_prefix: {why} -> least loaded {best.url}"
            return best
        self._expire(self._clock())
        hashes = list(prepared.hashes)
        best, matched, where = candidates[0], -1, ""
        for r in candidates:
            m, rank = self.blocks(r.url).match(hashes)
            sent = self._pending_run(r.url, hashes)
            if sent > m:
                m, source = sent, "sent there, not reported yet"
            else:
                source = f"held on rank {rank}"
            if m > matched or (m == matched and _least_loaded(r) < _least_loaded(best)):
                best, matched, where = r, m, source
        rate = matched / len(hashes)
        seen = f"{matched}/{len(hashes)} blocks ({rate:.2f})"
        if rate > self.cache_threshold:
            self.last_match = rate
            self.last_reason = (f"precise_prefix: {seen} {where} > {self.cache_threshold:.2f} "
                                f"-> {best.url}{self._stale(best.url)}")
            return best
        # As cache_aware picks the smallest tree: the fewest blocks held or sent, then the least loaded.
        # New prefixes spread evenly (least loaded first left 78/76/56/46 requests of 256 on four
        # replicas in bench/router_cache.py, this 68/67/64/57); once the engines' caches are full,
        # what they hold is about even and load decides.
        best = min(candidates, key=self._held_then_load)
        self.last_match = max(self.blocks(best.url).match(hashes)[0], self._pending_run(best.url, hashes)) / len(hashes)
        self.last_reason = (f"precise_prefix: best {seen} <= {self.cache_threshold:.2f} -> fewest blocks held "
                            f"or sent {best.url} ({self._held(best.url)}){self._stale(best.url)}")
        return best

    def on_assigned(self, replica: Replica, text: str | None, prepared: object = None) -> None:
        # What the replica caches its engines report; until they have, the prompt counts as held there,
        # so that a burst of requests with a new prefix does not spread it over every replica.
        if self.pending_s > 0 and isinstance(prepared, Prompt) and prepared.hashes:
            until = self._clock() + self.pending_s
            sent = self._pending.setdefault(replica.url, {})
            for h in prepared.hashes:
                sent[h] = until
            self._expiry.append((until, replica.url, prepared.hashes))

    def on_removed(self, url: str) -> None:
        self.replicas.pop(url, None)
        self._pending.pop(url, None)

    def _held_then_load(self, r: Replica) -> tuple[int, int, int, float]:
        return self._held(r.url), r.inflight, r.outstanding_bytes, r.last_assigned

    def _held(self, url: str) -> int:
        return self.blocks(url).blocks + len(self._pending.get(url, ()))

    def _pending_run(self, url: str, hashes: list[int]) -> int:
        sent = self._pending.get(url)
        if not sent:
            return 0
        n = 0
        for h in hashes:
            if h not in sent:
                break
            n += 1
        return n

    def _expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            until, url, hashes = self._expiry.popleft()
            sent = self._pending.get(url)
            if sent is not None:
                for h in hashes:
                    if sent.get(h) == until:  # not sent again since
                        del sent[h]

    def _stale(self, url: str) -> str:
        held = self.blocks(url)
        if held.mismatch:
            return f" (its events are not used: {held.mismatch})"
        return "" if held.connected else " (its KvEvents stream is down: what it holds may be stale)"
