"""Request ids' random hex (services/frontend/requests/request_ids.py): os.urandom's bytes, read a block at a
time (not one call a request), never handed out twice, nor to a forked child as well as its parent."""
from __future__ import annotations

import os
import re

import pytest

from services.frontend.requests import request_ids, translator


def test_ids_are_hex_of_the_size_asked_and_all_different(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.urandom

    def counted(n: int) -> bytes:
        calls.append(n)
        return real(n)

    monkeypatch.setattr(request_ids.os, "urandom", counted)
    monkeypatch.setattr(request_ids, "_pool", request_ids._Pool())
    ids = [request_ids.random_hex(12) for _ in range(1000)]
    assert all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert len(calls) == -(-1000 * 12 // request_ids._BLOCK)  # a block per 341 ids, not a call per id
    assert len(request_ids.random_hex(request_ids._BLOCK + 1)) == 2 * (request_ids._BLOCK + 1)


def test_a_forked_child_gets_bytes_of_its_own() -> None:
    request_ids.random_hex(12)  # the parent holds a block
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.close(read)
        os.write(write, request_ids.random_hex(12).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert re.fullmatch(r"[0-9a-f]{24}", child)
    assert child != request_ids.random_hex(12)


def test_the_translator_takes_its_ids_from_the_pool() -> None:
    assert translator.random_hex is request_ids.random_hex
