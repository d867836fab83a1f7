"""`kill -USR1 PID` has a process write every thread's stack to its stderr and run on: how a hung service
process is seen without a debugger (docs/deploy.md). Each service process installs it at its start."""
from __future__ import annotations

import faulthandler
import signal
import sys


def dump_stacks_on_usr1() -> None:
    """Install the dump, unless SIGUSR1 already has a handler (a program that embeds a service's main()
    uses it) or there is no stderr to write to."""
    if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL and sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
