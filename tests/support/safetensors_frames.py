"""A safetensors file as update_weights calls: its header read by hand, each tensor's bytes a slice of
the file's data (no torch), grouped into calls of a few tensors, one raw frame per tensor."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

# safetensors dtype codes -> torch dtype names (the update_weights contract).
DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
          "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def weight_calls(path: Path, per_call: int = 4) -> list[tuple[dict[str, Any], list[memoryview]]]:
    """[(update_weights args, raw frames)], in the file's order."""
    data = memoryview(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(bytes(data[8:8 + n]))
    header.pop("__metadata__", None)
    body = data[8 + n:]
    calls: list[tuple[dict[str, Any], list[memoryview]]] = []
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    for i in range(0, len(items), per_call):
        tensors: list[dict[str, Any]] = []
        frames: list[memoryview] = []
        for name, meta in items[i:i + per_call]:
            start, end = meta["data_offsets"]
            tensors.append({"name": name, "dtype": DTYPES[meta["dtype"]], "shape": meta["shape"],
                            "frame": len(frames), "offset": 0, "nbytes": end - start})
            frames.append(body[start:end])
        calls.append(({"tensors": tensors}, frames))
    return calls
