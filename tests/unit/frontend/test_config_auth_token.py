"""The frontend takes the engines' handshake token as they do: a file or $ENGINE_AUTH_TOKEN, the flag last."""
from __future__ import annotations

from pathlib import Path

import pytest

from protocol.handshake import auth_token_from
from services.frontend.config import parse_args


def test_the_token_comes_from_a_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGINE_AUTH_TOKEN", raising=False)
    assert parse_args(["--model", "tiny"]).auth_token is None
    monkeypatch.setenv("ENGINE_AUTH_TOKEN", "from-env")
    assert parse_args(["--model", "tiny"]).auth_token == "from-env"
    token = tmp_path / "token"
    token.write_text("from-file\n")
    c = parse_args(["--model", "tiny", "--auth-token-file", str(token)])
    assert c.auth_token == "from-file" and "from-file" not in repr(c)


def test_two_sources_an_unreadable_file_or_an_empty_token_are_refused(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny", "--auth-token-file", str(token), "--auth-token", "t"])
    assert "--auth-token-file and --auth-token are exclusive" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--auth-token-file='/nonexistent/token' is invalid: No such file"):
        auth_token_from(None, "/nonexistent/token", {})
    with pytest.raises(ValueError, match="is empty"):
        auth_token_from("  ", None, {})
    assert auth_token_from(None, None, {"ENGINE_AUTH_TOKEN": ""}) is None  # an empty variable is no token
