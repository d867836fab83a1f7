from __future__ import annotations

import pytest

from services.engine.utility import ALLOWED, UtilityError, check


def test_allowlisted_calls_pass() -> None:
    check("sleep", {"level": 1})
    check("add_lora", {"name": "a", "path": "/x"})
    check("stats", {})


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("__init__", {}, "unknown utility '__init__'; allowed: add_lora"),
        ("sleep", {}, "missing argument 'level'"),
        ("sleep", {"level": "1"}, "'level' must be int, got str"),
        ("sleep", {"level": True}, "'level' must be int, got bool"),
        ("stats", {"x": 1}, "unknown argument(s) ['x']"),
    ],
)
def test_bad_calls_name_the_problem(name: str, args: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(UtilityError) as err:
        check(name, args)
    assert message in str(err.value)


def test_allowlist_is_the_documented_one() -> None:
    assert sorted(ALLOWED) == sorted(["stats", "pause", "resume", "reset_prefix_cache", "sleep",
                                      "wake_up", "add_lora", "remove_lora", "list_loras"])
