"""KvEvents subscriptions of the router process: for each replica of a precise_prefix pool, one
grpc.aio stream from its frontend's --grpc-port on the router's event loop, applied to that replica's
ReplicaBlocks; resumed after the last event seen when it breaks, with a backoff between attempts."""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import grpc

from protocol.grpc import pb2, pb2_grpc
from services.router.backends.kv_blocks import ReplicaBlocks
from services.router.backends.policies.precise_prefix import PrecisePrefix
from services.router.backends.pool import Pool
from services.router.config import RouterConfig

log = logging.getLogger("router")

_GONE = (grpc.aio.AioRpcError, grpc.aio.UsageError, ConnectionError, OSError)


class _Gap(Exception):
    """The stream skipped a sequence number: what is held can no longer be trusted."""


class KvSubscriber:
    """One replica's stream. `run` never returns on a failure: it logs it and subscribes again."""

    def __init__(self, url: str, address: str, policy: PrecisePrefix, *, api_key: str | None = None,
                 backoff_s: float = 0.1, backoff_max_s: float = 5.0) -> None:
        self.url = url
        self.address = address
        self.policy = policy
        self.blocks: ReplicaBlocks = policy.blocks(url)
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self.streams = 0  # subscriptions that delivered an event (tests wait on it)
        self.changed = asyncio.Event()  # set after each applied event and when a stream ends (tests wait on it)

    async def run(self) -> None:
        delay = self._backoff_s
        # gRPC's own reconnect backoff (1 s growing to 120 s by default) would outlast ours: held to ours.
        options = [("grpc.initial_reconnect_backoff_ms", max(1, int(self._backoff_s * 1000))),
                   ("grpc.min_reconnect_backoff_ms", max(1, int(self._backoff_s * 1000))),
                   ("grpc.max_reconnect_backoff_ms", max(1, int(self._backoff_max_s * 1000)))]
        async with grpc.aio.insecure_channel(self.address, options=options) as channel:
            while True:
                try:
                    if await self._subscribe(channel):
                        delay = self._backoff_s  # it worked for a while: the next failure retries soon
                except _Gap as exc:
                    log.warning("precise_prefix: %s KvEvents %s: resubscribing from a snapshot", self.url, exc)
                    self.blocks.seq = 0
                    delay = self._backoff_s
                except _GONE as exc:
                    detail = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else exc
                    log.warning("precise_prefix: %s KvEvents stream from %s failed (%s); again in %.1fs",
                                self.url, self.address, detail, delay)
                finally:
                    self.blocks.connected = False
                    self.changed.set()
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self._backoff_max_s)

    async def _subscribe(self, channel: grpc.aio.Channel) -> bool:
        """One subscription, until the stream ends or breaks; whether it delivered any event."""
        await self._model_info(channel)
        held = self.blocks
        request = pb2.SubscribeRequest(after_seq=held.seq, relay_epoch=held.relay_epoch)
        call = pb2_grpc.KvEventsStub(channel).Subscribe(request, metadata=self._metadata)
        # A snapshot's events carry the relay's position (the seq of the last change they include), so
        # every change, after a snapshot too, is numbered one past the event before it.
        first, live = True, False  # live: the previous event was a change, not part of a snapshot
        try:
            async for event in call:
                if first:
                    first = False
                    self.streams += 1
                    held.connected = True
                    log.info("precise_prefix: %s KvEvents from %s: %s (block size %s)", self.url, self.address,
                             "a snapshot" if event.snapshot else f"resumed after seq {request.after_seq}",
                             self.policy.block_size)
                    if event.snapshot:
                        held.reset()  # what follows says all that is held
                    elif request.after_seq and (event.relay_epoch != held.relay_epoch
                                                or event.seq != held.seq + 1):
                        raise _Gap(f"resumed at seq {event.seq} of relay {event.relay_epoch!r}, not after "
                                   f"{held.seq} of {held.relay_epoch!r}")
                elif not event.snapshot and event.seq != held.seq + 1:
                    raise _Gap(f"jumped from seq {held.seq} to {event.seq}")
                elif event.snapshot and live:
                    held.reset()  # the relay started over (this subscriber fell behind what it keeps)
                live = not event.snapshot
                self._apply(event)
                held.relay_epoch, held.seq = event.relay_epoch, event.seq
                self.changed.set()
        finally:
            call.cancel()
        log.info("precise_prefix: %s KvEvents stream ended; subscribing again", self.url)
        return not first

    async def _model_info(self, channel: grpc.aio.Channel) -> None:
        """The engines' block size and context length, and whether the frontend tokenizes as we do."""
        try:
            info = await pb2_grpc.ControlStub(channel).GetModelInfo(pb2.GetModelInfoRequest(),
                                                                     metadata=self._metadata, timeout=10.0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            return  # the block size comes with the first stored event then, unchecked
        self.policy.learn_block_size(info.block_size, self.url)
        self.policy.learn_served_model(info.served_model_name, self.url)
        model = self.policy.model
        if model is None:
            return
        if info.max_model_len:
            model.max_model_len = info.max_model_len
        ours = model.tokenizer_sha256
        mismatch = ""
        if info.tokenizer_sha256 and ours and info.tokenizer_sha256 != ours:
            mismatch = (f"its tokenizer.json (sha256 {info.tokenizer_sha256[:12]}) is not the pool's tokenizer "
                        f"(sha256 {ours[:12]})")
        elif info.chat_template_sha256 and info.chat_template_sha256 != model.template.sha256:
            mismatch = (f"its chat template (sha256 {info.chat_template_sha256[:12]}) is not the pool's "
                        f"tokenizer's (sha256 {model.template.sha256[:12]})")
        if mismatch and mismatch != self.blocks.mismatch:
            log.warning("precise_prefix: %s: %s; its blocks are not scored", self.url, mismatch)
        self.blocks.mismatch = mismatch

    def _apply(self, event: Any) -> None:
        kind = event.WhichOneof("event")
        held = self.blocks
        if kind == "stored":
            if event.stored.block_size:
                self.policy.learn_block_size(event.stored.block_size, self.url)
            held.stored(event.rank, event.epoch, event.stored.block_hashes)
        elif kind == "removed":
            held.removed(event.rank, event.epoch, event.removed.block_hashes)
        elif kind == "cleared":
            held.cleared(event.rank, event.epoch)


class KvFeeds:
    """Every precise_prefix pool's subscriptions, started and stopped with the router: one per static
    replica (its `grpc`), and for a DNS pool one per address it resolves to (`dns.grpc_port` there),
    started and stopped as the membership changes (`sync`, after each DNS refresh)."""

    def __init__(self, config: RouterConfig, pools: Mapping[str, Pool]) -> None:
        self._config = config
        self._pools = pools
        self._live: dict[tuple[str, str], tuple[KvSubscriber, asyncio.Task[None] | None]] = {}  # (pool, url)
        self._started = False
        for name, pool in pools.items():
            pool_config = config.pools[name]
            if isinstance(pool.policy, PrecisePrefix) and pool_config.dns is None:
                for replica in pool_config.replicas:
                    assert replica.grpc is not None  # the config requires it for precise_prefix pools
                    self._add(name, replica.url, replica.grpc)

    @property
    def subscribers(self) -> list[KvSubscriber]:
        return [sub for sub, _ in self._live.values()]

    def start(self) -> None:
        self._started = True
        loop = asyncio.get_running_loop()
        for key, (sub, task) in list(self._live.items()):
            if task is None:
                self._live[key] = sub, loop.create_task(sub.run(), name=f"kv-events {sub.url}")
        for name in self._pools:
            self.sync(name)

    def sync(self, name: str) -> None:
        """A DNS pool's subscriptions to its replicas now: new addresses subscribed, departed ones dropped
        (the pool has dropped their blocks already: Pool.replace_replicas)."""
        pool, pool_config = self._pools[name], self._config.pools[name]
        dns = pool_config.dns
        if not isinstance(pool.policy, PrecisePrefix) or dns is None or not self._started:
            return
        assert dns.grpc_port is not None  # the config requires it for precise_prefix pools
        wanted = {r.url: grpc_address(r.url, dns.grpc_port) for r in pool.replicas}
        for (pool_name, url), (sub, task) in list(self._live.items()):
            if pool_name == name and wanted.get(url) != sub.address:
                if task is not None:
                    task.cancel()
                del self._live[(pool_name, url)]
                pool.policy.on_removed(url)
        for url, address in wanted.items():
            if (name, url) not in self._live:
                self._add(name, url, address)

    async def stop(self) -> None:
        tasks = [task for _, task in self._live.values() if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._live.clear()
        self._started = False

    def _add(self, name: str, url: str, address: str) -> None:
        pool, pool_config = self._pools[name], self._config.pools[name]
        assert isinstance(pool.policy, PrecisePrefix)
        sub = KvSubscriber(url, address, pool.policy, api_key=pool_config.api_key,
                           backoff_max_s=pool_config.precise_prefix.reconnect_max_s)
        task = asyncio.get_running_loop().create_task(sub.run(), name=f"kv-events {url}") if self._started else None
        self._live[(name, url)] = sub, task


def grpc_address(url: str, port: int) -> str:
    """The gRPC address of a replica found by DNS: its URL's host (an IPv6 one in brackets) and `port`."""
    host = urlsplit(url).netloc.rsplit(":", 1)[0]
    return f"{host}:{port}"
