"""The router's connection bounds on its command line (__main__.py): the defaults of every HTTP server
of the fleet (edge/connection_limits.py), and bad values refused naming the flag before anything starts."""
from __future__ import annotations

import pytest

from edge.connection_limits import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from services.frontend.config import parse_args
from services.router.__main__ import build_parser, main


def test_the_defaults_are_the_fleets() -> None:
    args = build_parser().parse_args(["--config", "r.yaml"])
    assert (args.header_timeout, args.max_connections) == (DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS)
    assert args.shutdown_timeout == parse_args(["--model", "tiny"]).shutdown_timeout_s == 30  # the frontend's


@pytest.mark.parametrize(("argv", "message"), [
    (["--header-timeout", "0"], "--header-timeout: expected > 0 seconds, got 0.0"),
    (["--max-connections", "0"], "--max-connections: expected >= 1, got 0"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout: expected >= 0 seconds, got -1.0"),
    (["--shutdown-timeout", "nan"], "--shutdown-timeout: expected >= 0 seconds, got nan"),
])
def test_bad_values_exit_with_a_message_naming_the_flag(argv: list[str], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", "/nonexistent/router.yaml", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
