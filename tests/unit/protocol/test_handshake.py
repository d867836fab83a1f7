from __future__ import annotations

from protocol import MAJOR, MINOR, RejectCode, check_hello, make_hello
from protocol.handshake import version_reject
from protocol.messages import Hello
from protocol.schema import current_fingerprint


def test_make_hello_carries_version_and_fingerprint() -> None:
    hello = make_hello("fe-1", "tok")
    assert (hello.major, hello.minor, hello.schema_fingerprint) == (MAJOR, MINOR, current_fingerprint())


def test_accepts_matching_major_any_minor() -> None:
    hello = Hello(MAJOR, MINOR + 3, "other-fingerprint", "fe-1")
    assert check_hello(hello, auth_token=None, draining=False) is None


def test_major_mismatch_names_both_versions() -> None:
    reject = check_hello(Hello(MAJOR + 1, 2, "x", "fe-1"), auth_token=None, draining=False)
    assert reject is not None and reject.code == RejectCode.VERSION.value
    assert f"{MAJOR + 1}.2" in reject.reason and f"{MAJOR}.{MINOR}" in reject.reason
    assert version_reject(MAJOR + 1, 2).reason == reject.reason


def test_auth_token_checked() -> None:
    assert check_hello(make_hello("fe", None), auth_token="s3", draining=False).code == "unauthorized"  # type: ignore[union-attr]
    assert check_hello(make_hello("fe", "bad"), auth_token="s3", draining=False).code == "unauthorized"  # type: ignore[union-attr]
    assert check_hello(make_hello("fe", "s3"), auth_token="s3", draining=False) is None


def test_draining_refuses() -> None:
    reject = check_hello(make_hello("fe"), auth_token=None, draining=True)
    assert reject is not None and reject.code == "draining"
