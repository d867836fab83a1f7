from __future__ import annotations

import pytest

from services.engine.utility import ALLOWED, UtilityError, check

TENSOR = {"name": "w", "dtype": "float32", "shape": [2, 3], "frame": 0, "offset": 0, "nbytes": 24}


def test_allowlisted_calls_pass() -> None:
    check("sleep", {"level": 1})
    check("add_lora", {"name": "a", "path": "/x"})
    check("stats", {})
    check("update_weights", {"tensors": [TENSOR, TENSOR]})
    check("update_weights", {"tensors": []})


def test_optional_arguments_get_their_default_and_keep_a_given_value() -> None:
    assert check("pause", {}) == {"mode": "keep"}
    assert check("pause", {"mode": "wait"}) == {"mode": "wait"}
    assert check("finish_weight_update", {"version": "v2"}) == {"version": "v2"}


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("__init__", {}, "unknown utility '__init__'; allowed: add_lora"),
        ("sleep", {}, "missing argument 'level' (one of 1, 2)"),
        ("sleep", {"level": "1"}, "'level' must be one of 1, 2, got '1' (str)"),
        ("sleep", {"level": True}, "'level' must be one of 1, 2, got True (bool)"),
        ("sleep", {"level": 3}, "'level' must be one of 1, 2, got 3 (int)"),
        ("stats", {"x": 1}, "unknown argument(s) ['x']"),
        ("pause", {"mode": "later"}, "utility 'pause': argument 'mode' must be one of 'keep', 'abort', 'wait', "
                                     "got 'later' (str)"),
        ("pause", {"mode": 1}, "argument 'mode' must be one of 'keep', 'abort', 'wait', got 1 (int)"),
        ("start_weight_update", {"version": "v1"}, "unknown argument(s) ['version']; allowed: []"),
        ("finish_weight_update", {}, "missing argument 'version' (str)"),
        ("update_weights", {}, "missing argument 'tensors' (a list of {name: str, dtype: str, shape: a list of "
                               "int, frame: int, offset: int, nbytes: int})"),
        ("update_weights", {"tensors": {}}, "argument 'tensors' must be a list of {name: str"),
        ("update_weights", {"tensors": [TENSOR, 5]}, "argument 'tensors[1]' must be {name: str"),
        ("update_weights", {"tensors": [{**TENSOR, "shape": [2, "3"]}]},
         "argument 'tensors[0].shape[1]' must be int, got str"),
        ("update_weights", {"tensors": [{**TENSOR, "nbytes": 24.0}]}, "argument 'tensors[0].nbytes' must be int"),
        ("update_weights", {"tensors": [{k: v for k, v in TENSOR.items() if k != "frame"}]},
         "argument 'tensors[0]' must have exactly the keys ['name', 'dtype', 'shape', 'frame', 'offset', "
         "'nbytes']; missing ['frame']"),
        ("update_weights", {"tensors": [{**TENSOR, "stride": [1]}]}, "; unknown ['stride']"),
    ],
)
def test_bad_calls_name_the_problem(name: str, args: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(UtilityError) as err:
        check(name, args)
    assert message in str(err.value)


def test_allowlist_is_the_documented_one() -> None:
    assert sorted(ALLOWED) == sorted([
        "stats", "pause", "resume", "is_paused", "reset_prefix_cache", "sleep", "wake_up", "is_sleeping",
        "add_lora", "remove_lora", "list_loras",
        "start_weight_update", "update_weights", "finish_weight_update", "weight_version",
    ])
