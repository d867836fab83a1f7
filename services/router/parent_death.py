"""Linux's PR_SET_PDEATHSIG for the router's child processes (its body-parsing workers, its managed
model workers through runtime/orphan_guard.py): a signal when the router dies, even by SIGKILL, which
runs no code to stop them. The frontend has its own copy: services never import each other."""
from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> bool:
    """Ask for `sig` when the parent process dies; False where Linux's prctl is not there (no-op)."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig) == 0
