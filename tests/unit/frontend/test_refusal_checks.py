"""The refused-fields check (services/frontend/requests/refusals.py): a request whose values were already
found to ask for nothing passes on one tuple comparison, without calling each field's predicate; any other
value is checked field by field, the first refused one named, also after passes were remembered."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from services.frontend.errors import APIError
from services.frontend.requests import refusals
from services.frontend.requests.refusals import Refusal


@dataclass
class _Req:
    a: Any = None
    b: Any = False


def _table(calls: list[str]) -> dict[str, Refusal]:
    def none(value: Any) -> bool:
        calls.append("a")
        return value is None

    def falsy(value: Any) -> bool:
        calls.append("b")
        return not value

    return {"a": Refusal(none, "a refused"), "b": Refusal(falsy, "b refused")}


def test_values_that_passed_pass_again_without_the_predicates() -> None:
    calls: list[str] = []
    table = _table(calls)
    refusals.check(_Req(), table)
    assert calls == ["a", "b"]
    calls.clear()
    for _ in range(3):
        refusals.check(_Req(), table)
    assert calls == []  # the remembered pass
    refusals.check(_Req(b=""), table)  # another unset value: checked once, then remembered too
    assert calls == ["a", "b"]
    calls.clear()
    refusals.check(_Req(b=""), table)
    assert calls == []


@pytest.mark.parametrize(("req", "field"), [(_Req(a=1), "a"), (_Req(b=True), "b"), (_Req(a=1, b=True), "a")])
def test_a_refused_value_is_named_after_passes_were_remembered(req: _Req, field: str) -> None:
    table = _table([])
    refusals.check(_Req(), table)
    for _ in range(2):  # refused every time: never remembered as passed
        with pytest.raises(APIError) as exc:
            refusals.check(req, table)
        assert exc.value.status == 400 and exc.value.param == field


def test_a_one_field_table() -> None:
    table = {"a": Refusal(lambda value: value is None, "a refused")}
    refusals.check(_Req(), table)
    refusals.check(_Req(), table)
    with pytest.raises(APIError):
        refusals.check(_Req(a="x"), table)
