"""edge/api_keys.py: one rule for every face: Bearer or x-api-key (Bearer first), every key compared."""
from __future__ import annotations

import pytest

from edge.api_keys import ApiKeys, KeyCheck, presented_key

KEYS = ApiKeys(["k-one", "k-two"])


@pytest.mark.parametrize(("headers", "key"), [
    ([(b"authorization", b"Bearer k-one")], b"k-one"),
    ([(b"authorization", b"bearer   k-one  ")], b"k-one"),  # the scheme in any case, the key stripped
    ([(b"x-api-key", b" k-two ")], b"k-two"),
    ([(b"x-api-key", b"k-two"), (b"authorization", b"Bearer k-one")], b"k-one"),  # Bearer wins, in any order
    ([(b"authorization", b"Bearer k-one"), (b"x-api-key", b"k-two")], b"k-one"),
    ([(b"authorization", b"Basic azE6cGFzcw=="), (b"x-api-key", b"k-two")], b"k-two"),  # not a Bearer: passed
    ([(b"authorization", b"Basic azE6cGFzcw==")], b""),
    ([(b"x-api-key", b"first"), (b"x-api-key", b"second")], b"first"),
    ([(b"content-type", b"application/json")], b""),
    ([("authorization", "Bearer k-one")], b"k-one"),  # gRPC metadata: str pairs
    ([("x-api-key", "k-two"), ("user-agent", "grpc-python")], b"k-two"),
])
def test_the_presented_key(headers: list[tuple[bytes | str, bytes | str]], key: bytes) -> None:
    assert presented_key(headers) == key


def test_a_check_tells_accepted_missing_and_wrong() -> None:
    assert KEYS.check([(b"authorization", b"Bearer k-two")]) is KeyCheck.ACCEPTED
    assert KEYS.check([("x-api-key", "k-one")]) is KeyCheck.ACCEPTED
    assert KEYS.check([]) is KeyCheck.MISSING
    assert KEYS.check([(b"authorization", b"Bearer ")]) is KeyCheck.MISSING
    assert KEYS.check([(b"authorization", b"Bearer k-three")]) is KeyCheck.WRONG
    assert KEYS.check([(b"authorization", b"Bearer k-one-and-more")]) is KeyCheck.WRONG
    # A wrong Bearer key is not rescued by a right x-api-key: the Bearer one is the key presented.
    assert KEYS.check([(b"authorization", b"Bearer nope"), (b"x-api-key", b"k-one")]) is KeyCheck.WRONG


def test_no_keys_accepts_everything() -> None:
    none = ApiKeys([])
    assert not none and KEYS
    assert none.check([]) is KeyCheck.ACCEPTED
