"""The gRPC schema (fleet.proto) matches its committed lock, and the checker refuses every edit that
is not a pure append, naming the message, the field and what to do instead."""
from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from protocol.grpc import PROTO, PROTO_DIR, lock, pb2


def _now() -> dict[str, Any]:
    return lock.describe()


def _locked() -> dict[str, Any]:
    return json.loads(lock.LOCK_PATH.read_text())


def test_proto_matches_committed_lock() -> None:
    problems = lock.check(_locked(), _now(), lock.reserved_in_proto((PROTO_DIR / PROTO).read_text()))
    assert problems == [], "\n".join(problems)


def test_every_service_is_in_the_schema() -> None:
    assert set(_now()["services"]) == {"fleet.v1.Inference", "fleet.v1.Control", "fleet.v1.RlControl",
                                       "fleet.v1.KvEvents"}
    assert pb2.DESCRIPTOR.package == "fleet.v1"


def _edit(fn: Any) -> list[str]:
    old = lock.merged(None, _now())
    new = copy.deepcopy(_now())
    fn(new)
    return lock.problems(old, new)


REQ = "fleet.v1.GenerateRequest"


@pytest.mark.parametrize(("edit", "expect"), [
    (lambda s: s["messages"][REQ]["fields"].__setitem__("2", ["tokens", "uint32", "repeated", ""]),
     "field 2 was 'token_ids: uint32'"),
    (lambda s: s["messages"][REQ]["fields"].__setitem__("6", ["priority", "int64", "", ""]),
     "field 6 was 'priority: int32'"),
    (lambda s: s["messages"][REQ]["fields"].pop("4"), "field 4 'return_text' was removed without reserving"),
    (lambda s: s["messages"][REQ]["fields"].__setitem__("3", ["sampling_params", "fleet.v1.SamplingParams",
                                                               "repeated", ""]), "changed label"),
    (lambda s: s["messages"].pop("fleet.v1.Usage"), "message fleet.v1.Usage was removed"),
    (lambda s: s["enums"]["fleet.v1.PauseMode"].__setitem__("PAUSE_MODE_WAIT", 7), "PAUSE_MODE_WAIT = 3"),
    (lambda s: s["services"]["fleet.v1.Inference"]["GenerateStream"].__setitem__(3, False), "method GenerateStream"),
    (lambda s: s.__setitem__("package", "fleet.v2"), "a new version is a new package"),
], ids=["rename", "retype", "remove", "relabel", "drop-message", "renumber-enum", "unstream", "package"])
def test_breaking_edits_are_refused(edit: Any, expect: str) -> None:
    problems = _edit(edit)
    assert problems, "a breaking edit passed the lock check"
    assert expect in "\n".join(problems)


def test_removing_a_field_is_allowed_when_its_number_and_name_are_reserved() -> None:
    old = lock.merged(None, _now())
    new = copy.deepcopy(_now())
    new["messages"][REQ]["fields"].pop("8")
    assert lock.problems(old, new, {REQ: ({8}, {"lora_name"})}) == []
    # ... and the lock remembers the number, so it cannot come back under another name.
    relocked = lock.merged(old, new)
    assert relocked["messages"][REQ]["reserved"] == [8]
    again = copy.deepcopy(new)
    again["messages"][REQ]["fields"]["8"] = ["adapter", "string", "", ""]
    assert "was removed before and may not be reused" in "\n".join(lock.problems(relocked, again))


def test_a_new_field_must_take_a_number_above_every_one_used() -> None:
    problems = _edit(lambda s: s["messages"]["fleet.v1.Usage"]["fields"].__setitem__(
        "2", ["completion_tokens", "uint32", "", ""]) or s["messages"]["fleet.v1.Usage"]["fields"].pop("3"))
    assert any("removed without reserving" in p for p in problems)
    old = lock.merged(None, _now())
    old["messages"]["fleet.v1.Usage"]["reserved"] = [9]
    new = copy.deepcopy(_now())
    new["messages"]["fleet.v1.Usage"]["fields"]["5"] = ["reasoning_tokens", "uint32", "", ""]
    assert "not above every number the message used (9)" in "\n".join(lock.problems(old, new))
    new["messages"]["fleet.v1.Usage"]["fields"].pop("5")
    new["messages"]["fleet.v1.Usage"]["fields"]["10"] = ["reasoning_tokens", "uint32", "", ""]
    assert lock.problems(old, new) == []


def test_a_stale_or_hand_edited_lock_is_named() -> None:
    stale = lock.merged(None, _now())
    grown = copy.deepcopy(_now())
    grown["messages"]["fleet.v1.Usage"]["fields"]["4"] = ["reasoning_tokens", "uint32", "", ""]
    assert "the lock is stale" in lock.check(stale, grown)[0]
    edited = copy.deepcopy(stale)
    edited["messages"]["fleet.v1.Usage"]["fields"]["4"] = ["reasoning_tokens", "uint32", "", ""]
    assert "edited by hand" in lock.check(edited, grown)[0]


def test_reserved_lines_are_read_from_proto_text() -> None:
    text = 'package fleet.v1;\nmessage A {\n  reserved 2, 4 to 6;\n  reserved "old";\n  message B {\n' \
           '    reserved 9;\n  }\n  oneof x {\n    string y = 1;\n  }\n}\n'
    assert lock.reserved_in_proto(text) == {"fleet.v1.A": ({2, 4, 5, 6}, {"old"}), "fleet.v1.A.B": ({9}, set())}
