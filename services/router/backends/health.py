"""Background loops of the router process: active health checks of every replica, and replica sets
resolved from DNS names and refreshed. Results go to the pools' readiness and circuit breakers: the
chat pools' and the model runtime's deployments' alike (each a Pool, checked as a `Checked`)."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from services.router.backends.pool import Pool
from services.router.backends.upstream import Upstream
from services.router.config import DnsConfig, HealthConfig, RouterConfig

log = logging.getLogger("router.health")


@dataclass(slots=True, frozen=True)
class Checked:
    """A pool as the checker sees it: its replicas, how to check them, and where they come from."""
    pool: Pool
    health: HealthConfig
    api_key: str | None = None
    dns: DnsConfig | None = None


def pool_checks(config: RouterConfig, pools: Mapping[str, Pool]) -> dict[str, Checked]:
    """The config's chat pools, each with its health section, key and DNS name."""
    return {name: Checked(pools[name], p.health, p.api_key, p.dns) for name, p in config.pools.items()}


class HealthChecker:
    def __init__(self, checks: Mapping[str, Checked], upstream: Upstream) -> None:
        self.checks = checks
        self.upstream = upstream
        self._tasks: list[asyncio.Task[None]] = []
        self.on_replaced: Callable[[str], None] | None = None  # told a pool's name when DNS changed its replicas

    async def resolve_all(self) -> None:
        """Every DNS-discovered pool resolved once, before the router takes requests."""
        await asyncio.gather(*(self._resolve(name, c.dns) for name, c in self.checks.items() if c.dns))

    def start(self, names: Iterable[str] | None = None) -> None:
        """The checks of `names` (default: every pool) at their interval, until `stop`."""
        loop = asyncio.get_running_loop()
        for name in self.checks if names is None else names:
            checked = self.checks[name]
            self._tasks.append(loop.create_task(self._check_loop(name, checked.health)))
            if checked.dns is not None:
                self._tasks.append(loop.create_task(self._dns_loop(name, checked.dns)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def check_once(self, name: str) -> None:
        checked = self.checks[name]
        pool, health = checked.pool, checked.health

        async def check(replica_url: str) -> None:
            sent_at = pool.now()
            ok, detail = await self.upstream.get_ok(replica_url + health.path, health.timeout_s,
                                                    api_key=checked.api_key)
            replica = pool.get(replica_url)
            if replica is None:  # left the pool (DNS) while being checked
                return
            was_ready, breaker = pool.is_ready(replica), replica.breaker
            pool.record_health(replica, ok, detail=detail, sent_at=sent_at)
            if was_ready != pool.is_ready(replica):  # a change, logged once: back in service is routine
                closed = " after being down: its breaker is closed" if breaker != replica.breaker else ""
                log.log(logging.INFO if ok else logging.WARNING, "%s %s: replica %s is %s (%s)%s", pool.kind,
                        name, replica_url, "ready" if ok else "not ready", detail, closed)

        await asyncio.gather(*(check(r.url) for r in list(pool.replicas)))

    async def _check_loop(self, name: str, health: HealthConfig) -> None:
        while True:
            try:
                await self.check_once(name)
            except Exception:  # a bug here must not stop the checks of every later round
                log.exception("%s %s: health check round failed", self.checks[name].pool.kind, name)
            await asyncio.sleep(health.interval_s)

    async def _dns_loop(self, name: str, dns: DnsConfig) -> None:
        while True:
            await asyncio.sleep(dns.refresh_s)
            await self._resolve(name, dns)

    async def _resolve(self, name: str, dns: DnsConfig) -> None:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(dns.name, dns.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            # Keep the last known replicas: a DNS hiccup should not empty a pool that still serves.
            log.warning("pool %s: cannot resolve %s (%s); keeping %d replica(s)", name, dns.name, exc,
                        len(self.checks[name].pool.replicas))
            return
        urls = sorted({replica_url(dns.scheme, str(info[4][0]), dns.port) for info in infos})
        pool = self.checks[name].pool
        if urls != [r.url for r in pool.replicas]:
            log.info("pool %s: %s resolves to %s", name, dns.name, ", ".join(urls) or "nothing")
            pool.replace_replicas(urls)
            if self.on_replaced is not None:
                self.on_replaced(name)
            if self._tasks:  # serving: check the new members now rather than at the next round
                await self.check_once(name)


def replica_url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address.split("%")[0]).version == 6 else address
    return f"{scheme}://{host}:{port}"
