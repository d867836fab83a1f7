"""Polling for what a service does in the background (a store write, an index pass): probe until the
probe gives something, or fail saying what did not happen in time."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0, every_s: float = 0.1) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s"
        time.sleep(every_s)
