"""The frontend's connection bounds on its command line (config.py): their defaults, and the values
refused with a message naming the flag; granian, which cannot bound its connections, refuses the limit."""
from __future__ import annotations

import pytest

from edge.connection_limits import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from services.frontend.config import parse_args


def test_the_defaults_bound_every_server_that_can_be_bounded() -> None:
    c = parse_args(["--model", "tiny"])
    assert (c.header_timeout_s, c.connection_limit) == (DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS)
    c = parse_args(["--model", "tiny", "--http-server", "hypercorn", "--header-timeout", "2.5",
                    "--max-connections", "64"])
    assert (c.header_timeout_s, c.connection_limit) == (2.5, 64)
    assert parse_args(["--model", "tiny", "--http-server", "granian"]).header_timeout_s == DEFAULT_HEADER_TIMEOUT_S


@pytest.mark.parametrize(("argv", "message"), [
    (["--header-timeout", "0"], "--header-timeout=0.0 is invalid: allowed > 0 seconds"),
    (["--max-connections", "0"], "--max-connections=0 is invalid: allowed >= 1"),
    (["--http-server", "granian", "--max-connections", "64"],
     "--max-connections=64 is invalid: allowed left out with --http-server granian"),
])
def test_bad_values_exit_with_a_message_naming_the_flag(argv: list[str], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model", "tiny", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
