"""`python -m deploy.compose`: the compose files run in containers on podman, health-gated, where
podman-compose alone does not wait on `depends_on: condition: service_healthy` (podman < 4.6, or no
systemd to run healthchecks). Elsewhere `docker compose` / `podman-compose` run the same files as they are.

    python -m deploy.compose [-f FILE ...] [-p NAME] up [-d] [--wait]
    python -m deploy.compose [-f FILE ...] [-p NAME] down [-v] [-t SECONDS]
    python -m deploy.compose [-f FILE ...] [-p NAME] logs [-f] [--tail N] [SERVICE ...]
    python -m deploy.compose [-f FILE ...] [-p NAME] ps
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from pathlib import Path

from deploy.compose import keeper
from deploy.compose.health import Unhealthy
from deploy.compose.plan import PlanError
from deploy.compose.project import ComposeError, Project
from deploy.podman import Podman, PodmanError

DEFAULT_FILE = Path(__file__).resolve().parent / "compose.yaml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.compose", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", action="append", type=Path,
                   help=f"a compose file, in order (default {DEFAULT_FILE})")
    p.add_argument("-p", "--project-name", help="the project (default: the files' `name:`)")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="create and start, in depends_on order")
    up.add_argument("-d", "--detach", action="store_true",
                    help="return once started; a keeper process runs the healthchecks until `down`")
    up.add_argument("--wait", action="store_true", help="and until every service with a healthcheck is healthy")
    down = sub.add_parser("down", help="stop and remove the containers, the pod and the network")
    down.add_argument("-v", "--volumes", action="store_true", help="the named volumes too")
    down.add_argument("-t", "--timeout", type=float, help="seconds to wait for each container to stop "
                      "(default: its stop_grace_period)")
    sub.add_parser("logs", help="podman-compose logs (its options pass through)", add_help=False)
    sub.add_parser("ps", help="podman-compose ps (its options pass through)", add_help=False)
    args, rest = p.parse_known_args(argv)
    if rest and args.command not in ("logs", "ps"):
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    project = Project(tuple(args.file or [DEFAULT_FILE]), args.project_name, Podman.default(),
                      say=lambda line: print(f"compose | {line}", flush=True))
    try:
        if args.command == "up":
            return _up(project, args.detach, args.wait)
        if args.command == "down":
            keeper.stop(project.podman, project.project_name())
            project.down(volumes=args.volumes, timeout_s=args.timeout)
            return 0
        return project.passthrough([args.command, *rest])
    except (ComposeError, PodmanError, PlanError, Unhealthy) as e:
        print(f"compose | {e}", file=sys.stderr, flush=True)
        return 1


def _up(project: Project, detach: bool, wait: bool) -> int:
    name = project.project_name()
    try:
        project.up(wait=wait)
    except (ComposeError, PodmanError, Unhealthy):
        print(f"compose | not up; what was started is left for a look: `python -m deploy.compose -p {name} logs`, "
              f"then `python -m deploy.compose -p {name} down -v`", file=sys.stderr, flush=True)
        raise
    if detach:
        pid = keeper.start(project.podman, name)
        project.say(f"up; healthchecks kept by pid {pid} until `down`")
        return 0
    # Attached, as `podman-compose up`: every service's output here, the healthchecks kept by this process,
    # and Ctrl-C (or SIGTERM) takes the project down.
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    kept = threading.Thread(target=keeper.keep, args=(project.podman, name, stopping), daemon=True)
    kept.start()
    logs = subprocess.Popen(project.argv("logs", "-f"), env=project.podman.env(), start_new_session=True)
    while not stopping.wait(1.0) and kept.is_alive():  # the keeper ends when the project's containers are gone
        pass
    logs.terminate()
    logs.wait(30)
    kept.join(60)
    project.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
