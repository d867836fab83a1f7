"""Calls to replicas: one shared httpx client, a response opened in streaming mode so bytes pass
through as they arrive, and the rule for what may be retried (nothing sent to the client yet)."""
from __future__ import annotations

import httpx


class UpstreamError(Exception):
    """The replica failed before any response byte: safe to retry on another replica."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url


class Upstream:
    def __init__(self) -> None:
        self.client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
            timeout=httpx.Timeout(connect=5.0, read=None, write=30.0, pool=5.0),
        )

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None,
                   timeout_s: float) -> httpx.Response:
        """POST and wait for the response head. Connection errors and 5xx/429 heads raise
        UpstreamError (retryable); other statuses are returned for the caller to pass on."""
        # identity: bytes pass through to the client as they are, without re-encoding.
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        request = self.client.build_request("POST", base_url + path, content=body, headers=headers,
                                            timeout=httpx.Timeout(timeout_s, connect=5.0))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise UpstreamError(base_url, f"{type(exc).__name__}: {exc}") from None
        if response.status_code >= 500 or response.status_code == 429:
            detail = (await response.aread())[:300].decode(errors="replace")
            await response.aclose()
            raise UpstreamError(base_url, f"HTTP {response.status_code}: {detail}")
        return response

    async def get_ok(self, url: str, timeout_s: float, *, api_key: str | None = None) -> tuple[bool, str]:
        """An active health check: any status below 400 passes."""
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        try:
            r = await self.client.get(url, timeout=timeout_s, headers=headers)
        except httpx.HTTPError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return r.status_code < 400, f"HTTP {r.status_code}"

    async def close(self) -> None:
        await self.client.aclose()
