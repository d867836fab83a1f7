"""services/router/parent_death.py: the one PR_SET_PDEATHSIG call the router's child processes share."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

_READ_BACK = """
import ctypes, signal
from services.router.parent_death import die_with_parent
assert die_with_parent()
got = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(got))  # PR_GET_PDEATHSIG
print(got.value == signal.SIGTERM)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_asks_for_sigterm_when_its_parent_dies() -> None:
    out = subprocess.run([sys.executable, "-c", _READ_BACK], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True)
    assert out.stdout.strip() == "True"
