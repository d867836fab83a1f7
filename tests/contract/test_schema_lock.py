"""The committed schema lock matches the code, and the checker refuses every edit that is not a pure
append, with a message that names the struct and field and says what to do instead."""
from __future__ import annotations

import copy

import pytest

from protocol import schema
from protocol.schema import check, compatibility_problems, describe, fingerprint, load_lock


def _locked(s: dict) -> dict:
    s = copy.deepcopy(s)
    s["fingerprint"] = fingerprint(s)
    return s


def test_code_matches_committed_lock() -> None:
    problems = check(load_lock(), describe())
    assert problems == [], "\n".join(problems)


def test_fingerprint_covers_layout_not_version() -> None:
    now = describe()
    bumped = dict(now, minor=now["minor"] + 1)
    assert fingerprint(bumped) == fingerprint(now)
    moved = copy.deepcopy(now)
    moved["structs"]["Abort"][0][1] = "list[bytes]"
    assert fingerprint(moved) != fingerprint(now)


def _edit(struct: str, fn) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    lock = _locked(describe())
    now = copy.deepcopy(describe())
    fn(now["structs"][struct])
    return lock, now


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (lambda f: f.insert(0, ["x", "int", True]), "field #0 was 'rank: int'"),
        (lambda f: f.__setitem__(1, ["sequence", "int", False]), "field #1 was 'seq: int'"),
        (lambda f: f.__setitem__(3, ["running", "float", False]), "retyped"),
        (lambda f: f.pop(), "'iteration_tokens_sum: int' was removed"),
        (lambda f: f.reverse(), "field #0"),
        (lambda f: f.append(["extra", "int", False]), "appended field 'extra: int' has no default"),
    ],
    ids=["insert", "rename", "retype", "remove", "reorder", "append-without-default"],
)
def test_breaking_edits_are_refused_with_a_reason(edit, expect: str) -> None:  # type: ignore[no-untyped-def]
    lock, now = _edit("Stats", edit)
    problems = compatibility_problems(lock, now)
    assert problems, "a breaking edit passed the lock check"
    text = "\n".join(problems)
    assert "Stats" in text and expect in text
    assert "append" in text  # says what to do instead


def test_removed_default_is_refused() -> None:
    lock, now = _edit("Hello", lambda f: f[-1].__setitem__(2, False))
    assert "lost its default" in "\n".join(compatibility_problems(lock, now))


def test_removed_or_retagged_message_is_refused() -> None:
    lock = _locked(describe())
    now = copy.deepcopy(describe())
    now["tags"]["Abort"] = 99
    assert "changed tag" in "\n".join(compatibility_problems(lock, now))
    del now["tags"]["Abort"], now["structs"]["Abort"]
    assert "Abort" in "\n".join(compatibility_problems(lock, now))


def test_pure_append_needs_minor_bump_then_lock_update() -> None:
    lock, now = _edit("Stats", lambda f: f.append(["extra", "int", True]))
    assert compatibility_problems(lock, now) == []
    assert "bump protocol.version.MINOR" in check(lock, now)[0]
    now["minor"] += 1
    assert "--update" in check(lock, now)[0]


def test_breaking_change_with_major_bump_only_needs_lock_update() -> None:
    lock, now = _edit("Stats", lambda f: f.insert(0, ["x", "int", False]))
    now["major"] += 1
    problems = check(lock, now)
    assert len(problems) == 1 and "--update" in problems[0]


def test_hand_edited_lock_is_detected() -> None:
    lock = _locked(describe())
    lock["structs"]["Abort"].append(["sneaky", "int", True])
    assert "edited by hand" in check(lock, describe())[0]


def test_cli_check_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert schema.main([]) == 0
    assert "matches lock" in capsys.readouterr().out
