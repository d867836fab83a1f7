"""The JSON depth check every face runs on a body (edge/json_depth.py): exact against the depth of the
decoded value, strings and escapes included."""
from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge import json_depth

MODULES = [json_depth]
# Strings full of what the scan must see through: brackets, quotes, backslashes.
TRICKY = st.text(alphabet=st.sampled_from('[]{}"\\ab\n'), max_size=12)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | TRICKY,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
                    max_leaves=40)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def nested(levels: int, leaf: str = "1") -> bytes:
    return ('{"a":[' * (levels // 2) + ("[" if levels % 2 else "") + leaf + ("]" if levels % 2 else "")
            + "]}" * (levels // 2)).encode()


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
@settings(max_examples=300, derandomize=True, database=None)
@given(value=JSON, limit=st.integers(0, 8), indent=st.sampled_from([None, 1]))
def test_matches_the_depth_of_the_decoded_value(module: ModuleType, value: Any, limit: int,
                                                indent: int | None) -> None:
    body = json.dumps(value, indent=indent).encode()
    assert module.too_deep(body, limit) == (depth(value) > limit)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_the_limit_and_what_does_not_count(module: ModuleType) -> None:
    limit = module.MAX_DEPTH
    assert depth(json.loads(nested(limit))) == limit and not module.too_deep(nested(limit))
    assert module.too_deep(nested(limit + 1)) and module.too_deep(nested(1000))
    assert module.too_deep(b"[" * 2_000_000 + b"]" * 2_000_000)
    # Brackets in strings, escaped quotes and escaped backslashes before a quote do not nest.
    assert not module.too_deep(json.dumps({"a": ["[" * 500, '\\"{' * 500, "\\" * 3 + '"' + "[" * 100]}).encode())
    wide = b"[" * (limit - 2) + b"[{},[]]," * 100_000 + b"[]" + b"]" * (limit - 2)  # 64 deep, 1 MB wide
    assert not module.too_deep(wide)
    assert module.too_deep(b"[" + wide + b"]")
