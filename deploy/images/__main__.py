"""`python -m deploy.images [slim|engine-cpu|engine-cuda|all]`: build the fleet's images with podman on a
host with no Docker engine and no registry (`make images`). Elsewhere `docker build` (docs/deploy.md)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from deploy.images import NAMES, WHEELS_ENV, recipe
from deploy.podman import Podman, PodmanError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m deploy.images", description="Build the fleet's images with "
                                "podman (deploy/podman.py: its own storage root, vfs, runc) over a local "
                                "Debian base; engine-cuda over the engine-cpu image.")
    p.add_argument("images", nargs="*", default=["all"], choices=[*NAMES, "all"],
                   help="which to build, in this order (default: all; engine-cuda needs engine-cpu built)")
    p.add_argument("--wheels", type=Path, default=None,
                   help=f"directory holding torch's CPU wheel for engine-cpu (default: ${WHEELS_ENV}, else a "
                        "--find-links directory of pip's that has one, else PyTorch's CPU index)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    wanted = NAMES if "all" in args.images else tuple(n for n in NAMES if n in args.images)
    podman = Podman.default()
    try:
        for name in wanted:
            plan = recipe(name, podman, args.wheels)
            print(f"== {plan.tag} from {plan.dockerfile.name} over {plan.base}"
                  + "".join(f", {k}={v}" for k, v in plan.build_args.items()), flush=True)
            started = time.monotonic()
            plan.build(podman, quiet=False)
            size = podman.run("image", "inspect", "--format", "{{.Size}}", plan.tag).stdout.strip()
            print(f"== {plan.tag}: {int(size) / 1e6:,.0f} MB, built in {time.monotonic() - started:.0f} s",
                  flush=True)
    except (PodmanError, ValueError) as e:
        sys.exit(f"deploy.images: {e}")


if __name__ == "__main__":
    main()
