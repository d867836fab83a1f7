"""Weight-update sessions (start, update, finish) and the tensors of one `update_weights` call, read
from its raw frames without a copy. Runs in the engine process; backends use it, it imports no torch.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from protocol.logprobs import Buffer

INITIAL_VERSION = "0"  # the weight version of a freshly started engine: the checkpoint's own weights

# torch dtype names (str(torch.float32) without "torch.") -> bytes per element.
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


class WeightUpdateError(ValueError):
    """A weight-update call out of order or with tensors that do not match their frames."""


@dataclass(frozen=True, slots=True)
class TensorView:
    name: str
    dtype: str  # a key of ITEMSIZE
    shape: tuple[int, ...]
    data: memoryview  # exactly its bytes, a slice of the call's frame


def views(tensors: list[dict[str, Any]], frames: Sequence[Buffer]) -> list[TensorView]:
    """Each tensor's bytes in the frames, checked: dtype known, shape non-negative, nbytes equal to
    shape x itemsize, the byte range inside its frame. `tensors` passed utility.check (types are right)."""
    out = []
    mvs = [memoryview(f).cast("B") for f in frames]
    for i, t in enumerate(tensors):
        name, dtype, shape = t["name"], t["dtype"], tuple(t["shape"])
        where = f"tensors[{i}] ({name!r})"
        if not name:
            raise WeightUpdateError(f"tensors[{i}].name must not be empty")
        itemsize = ITEMSIZE.get(dtype)
        if itemsize is None:
            raise WeightUpdateError(f"{where}: dtype {dtype!r} is not one of {', '.join(ITEMSIZE)}")
        if any(d < 0 for d in shape):
            raise WeightUpdateError(f"{where}: shape {list(shape)} has a negative dimension")
        if t["nbytes"] != prod(shape) * itemsize:
            raise WeightUpdateError(f"{where}: nbytes {t['nbytes']} != {prod(shape)} elements of shape "
                                    f"{list(shape)} x {itemsize} bytes ({dtype})")
        frame, offset, nbytes = t["frame"], t["offset"], t["nbytes"]
        if not 0 <= frame < len(mvs):
            raise WeightUpdateError(f"{where}: frame {frame} is not one of the call's {len(mvs)} raw frame(s)")
        if offset < 0 or offset + nbytes > len(mvs[frame]):
            raise WeightUpdateError(f"{where}: bytes [{offset}, {offset + nbytes}) lie outside frame {frame} "
                                    f"({len(mvs[frame])} bytes)")
        out.append(TensorView(name, dtype, shape, mvs[frame][offset:offset + nbytes]))
    return out


class WeightSession:
    """At most one update open at a time; the version moves only when one finishes."""

    def __init__(self, *, once_each: bool = False) -> None:
        """`once_each`: refuse a tensor sent twice in one update (the vllm backend's layerwise reload)."""
        self.once_each = once_each
        self.version = INITIAL_VERSION
        self.open = False
        self.tensors = 0  # received in the open update
        self.bytes = 0
        self.names: set[str] = set()  # of the tensors received in the open update

    def start(self) -> None:
        if self.open:
            raise WeightUpdateError(f"a weight update is already open ({self.tensors} tensor(s), {self.bytes} "
                                    "bytes received); finish it before starting another")
        self.open, self.tensors, self.bytes, self.names = True, 0, 0, set()

    def require_open(self, utility: str) -> None:
        if not self.open:
            raise WeightUpdateError(f"{utility}: no weight update is open; call start_weight_update first")

    def received(self, tensors: list[TensorView]) -> dict[str, int]:
        """Counts one update_weights call's tensors; its result. With `once_each`, a tensor sent twice in
        one update is refused before any is counted: vLLM's layerwise reload counts a layer's tensors to
        know when it is complete, so a repeat would complete a layer before its last tensor came."""
        if self.once_each:
            names = Counter(t.name for t in tensors)
            again = sorted(n for n, k in names.items() if k > 1 or n in self.names)
            if again:
                raise WeightUpdateError(f"update_weights: tensor(s) {again[:5]} already sent in this update; this "
                                        "engine loads each tensor once per update")
            self.names.update(names)
        nbytes = sum(len(t.data) for t in tensors)
        self.tensors += len(tensors)
        self.bytes += nbytes
        return {"tensors": len(tensors), "bytes": nbytes}

    def check_finish(self, version: str) -> None:
        """What finish refuses, checked before a backend finishes its model's side of the update."""
        self.require_open("finish_weight_update")
        if not version:
            raise WeightUpdateError("finish_weight_update: version must not be empty")

    def finish(self, version: str) -> dict[str, str]:
        self.check_finish(version)
        self.open, self.version = False, version
        return {"version": version}

    def abandon(self) -> None:
        """Closes the open update without a new version (its start failed halfway)."""
        self.open = False
