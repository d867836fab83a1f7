"""Random hex for the ids of engine requests, from os.urandom read a block at a time. Runs in each API
server process (on its event loop, and wherever else a request is translated)."""
from __future__ import annotations

import os
import threading

# os.urandom lets go of the GIL for its getrandom call; on the event loop, taking it back means waiting on
# the engine socket thread's turn (~25 us of a short request's CPU, measured): one call per this many
# bytes, not one a request. The bytes are as random as before; only the reads are fewer.
_BLOCK = 4096


class _Pool:
    __slots__ = ("at", "bytes", "lock")

    def __init__(self) -> None:
        self.bytes = b""
        self.at = 0
        self.lock = threading.Lock()


_pool = _Pool()


def random_hex(nbytes: int) -> str:
    """`nbytes` random bytes (at most _BLOCK) in hex, as os.urandom(nbytes).hex(); never the same bytes twice
    in one process, nor in a process forked from it."""
    pool = _pool
    with pool.lock:
        end = pool.at + nbytes
        if end > len(pool.bytes):
            pool.bytes, pool.at, end = os.urandom(max(_BLOCK, nbytes)), 0, nbytes
        start, pool.at = pool.at, end
        return pool.bytes[start:end].hex()


def _forget() -> None:
    """In a forked child: its parent's unread bytes would be its ids too."""
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_forget)
