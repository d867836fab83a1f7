"""`python -m services.router.runtime.orphan_guard PARENT_PID CMD...`: run CMD (exec, same process) so
that it gets SIGTERM when the router that started it dies, even by SIGKILL (Linux PR_SET_PDEATHSIG).

The router's managed workers start through it: stopping them on a clean exit is the supervisor's
job (managed.py), this covers the exit that runs no code. Set here, after the fork, rather than in a
`preexec_fn`, which is unsafe in a process with threads (the router has some)."""
from __future__ import annotations

import os
import sys

from services.router.parent_death import die_with_parent


def main(argv: list[str]) -> None:
    parent, cmd = int(argv[0]), argv[1:]
    die_with_parent()
    # The router may have died before the line above: then nobody would ever stop this process.
    if os.getppid() != parent:
        sys.exit(f"orphan_guard: the router (pid {parent}) is gone; not starting {cmd[0]}")
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
