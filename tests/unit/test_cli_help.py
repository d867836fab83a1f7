"""Every flag of the three services' command lines says what it does; the engine's and the frontend's
defaults are their config dataclasses' (one place), so `--help` and an unflagged start agree."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import MISSING, fields

import pytest

from services.engine.config import EngineConfig
from services.engine.config import build_parser as engine_parser
from services.frontend.config import FrontendConfig
from services.frontend.config import build_parser as frontend_parser
from services.router.__main__ import build_parser as router_parser

PARSERS = {"engine": engine_parser, "frontend": frontend_parser, "router": router_parser}


@pytest.mark.parametrize("name", PARSERS)
def test_every_flag_has_a_help_line(name: str) -> None:
    parser = PARSERS[name]()
    undocumented = [a.option_strings[0] for a in parser._actions
                    if not isinstance(a, argparse._HelpAction) and len((a.help or "").strip()) < 10]
    assert not undocumented, f"{name}: flags without help: {undocumented}"
    assert "--model" in parser.format_help() or name == "router"


@pytest.mark.parametrize(("parser", "config"), [(engine_parser, EngineConfig), (frontend_parser, FrontendConfig)])
def test_flag_defaults_are_the_dataclass_defaults(parser: Callable[[], argparse.ArgumentParser],
                                                  config: type) -> None:
    defaults = {f.name: f.default for f in fields(config) if f.default is not MISSING}
    for action in parser()._actions:
        if action.dest in defaults and action.default not in (None, [], ""):  # lists and strings parsed later
            assert action.default == defaults[action.dest], action.dest


def test_the_frontends_shutdown_timeout_defaults_to_the_engines_drain() -> None:
    """A frontend stopping with its engines gives its streams as long as the engines give theirs."""
    frontend = {f.name: f.default for f in fields(FrontendConfig)}
    engine = {f.name: f.default for f in fields(EngineConfig)}
    assert frontend["shutdown_timeout_s"] == engine["drain_timeout_s"]
