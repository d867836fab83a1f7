"""The `sim` backend: a fast engine-core simulator for load tests and routing experiments."""
from __future__ import annotations

from services.engine.backends.sim.backend import SimBackend
from services.engine.backends.sim.config import SimConfig

__all__ = ["SimBackend", "SimConfig"]
