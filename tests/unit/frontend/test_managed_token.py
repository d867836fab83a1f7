"""Managed mode hands the engines it starts the frontend's handshake token in their environment, never
on their command line (which `ps` shows to every user of the machine)."""
from __future__ import annotations

from typing import Any

import pytest

from services.frontend import managed
from services.frontend.config import FrontendConfig


class _Popen:
    started: list[tuple[list[str], dict[str, str]]] = []

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None, **_: Any) -> None:
        _Popen.started.append((cmd, dict(env or {})))

    def poll(self) -> int:
        return 0


@pytest.mark.parametrize("token", ["s3cret", None])
def test_the_token_travels_in_the_environment(token: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(managed.subprocess, "Popen", _Popen)
    monkeypatch.setenv("ENGINE_AUTH_TOKEN", "the parent's, not to be inherited")
    _Popen.started.clear()
    managed.ManagedEngines(FrontendConfig(model="tiny", backend="sim", auth_token=token)).start()
    ((cmd, env),) = _Popen.started
    assert "--auth-token" not in cmd and all("s3cret" not in arg for arg in cmd)
    assert env.get("ENGINE_AUTH_TOKEN") == token
