"""The fleet's gRPC schema (fleet/v1/fleet.proto) and its Python stubs, generated with grpcio-tools the
first time this package is imported and kept in the cache directory ($FLEET_CACHE_DIR or
~/.cache/fleet, keyed by the proto's hash and the tools' version); nothing generated is committed.

`pb2` holds the messages, `pb2_grpc` the servicer bases, stubs and `add_*_to_server` functions.
Imported only by code that speaks gRPC (the frontend's --grpc-port, the router's precise_prefix
policy, tests): the engine protocol (`protocol`) stays free of it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

PROTO_DIR = Path(__file__).parent
PROTO = "fleet/v1/fleet.proto"
PACKAGE = "fleet.v1"
SERVICES = ("Inference", "Control", "RlControl", "KvEvents")


def _cache_root() -> Path:
    env = os.environ.get("FLEET_CACHE_DIR")
    return (Path(env).expanduser().absolute() if env else Path.home() / ".cache" / "fleet") / "grpc"


def _generate(out: Path) -> None:
    """protoc (grpcio-tools') over the proto into `out`, atomically (several processes may race)."""
    from grpc_tools import protoc  # imported only to generate: a cold start with the stubs cached skips it

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=out.parent))
    try:
        include = Path(protoc.__file__).parent / "_proto"  # the well-known types
        code = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={tmp}",
                            f"--grpc_python_out={tmp}", str(PROTO_DIR / PROTO)])
        if code != 0:
            raise RuntimeError(f"grpcio-tools could not compile {PROTO_DIR / PROTO} (protoc exit {code})")
        gen = tmp / "fleet" / "v1"
        # The service module imports the messages by the proto's path (`from fleet.v1 import fleet_pb2`);
        # here they are loaded under this package's name instead, so nothing is put on sys.path.
        grpc_py = gen / "fleet_pb2_grpc.py"
        text = grpc_py.read_text()
        text = text.replace("from fleet.v1 import fleet_pb2 as", "from protocol.grpc import pb2 as")
        grpc_py.write_text(text)
        try:
            gen.rename(out)
        except OSError:  # another process made it first
            if not (out / "fleet_pb2_grpc.py").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _stubs() -> tuple[ModuleType, ModuleType]:
    import google.protobuf
    import grpc

    source = (PROTO_DIR / PROTO).read_bytes()
    key = hashlib.sha256(source + f"{grpc.__version__}/{google.protobuf.__version__}".encode()).hexdigest()[:16]
    out = _cache_root() / key
    if not (out / "fleet_pb2_grpc.py").is_file():
        _generate(out)
    messages = _load(f"{__name__}.pb2", out / "fleet_pb2.py")
    services = _load(f"{__name__}.pb2_grpc", out / "fleet_pb2_grpc.py")
    return messages, services


# Generated code is untyped to mypy (no stubs on its path): Any.
pb2: Any
pb2_grpc: Any
pb2, pb2_grpc = _stubs()


def service_names() -> list[str]:
    """The fully qualified names of this schema's services (for reflection)."""
    return [pb2.DESCRIPTOR.services_by_name[s].full_name for s in SERVICES]


# What a Tensor message holds beside its data, at most (a name and shape of any plausible length): a
# client's piece size is the server's max_message_bytes less this.
TENSOR_OVERHEAD_BYTES = 64 * 1024


def tensor_messages(name: str, dtype: str, shape: list[int], data: bytes | memoryview,
                    max_message_bytes: int) -> list[Any]:
    """One tensor as UpdateWeights' messages: one when it fits `max_message_bytes` (GetServerInfo's),
    else pieces, the first naming it and all but the last setting `more`."""
    piece = max(max_message_bytes - TENSOR_OVERHEAD_BYTES, 1)
    view = memoryview(data).cast("B")  # bytes, whatever the view's item size (a float32 array's, say)
    if view.nbytes <= piece:
        return [pb2.Tensor(name=name, dtype=dtype, shape=shape, data=bytes(view))]
    starts = range(0, view.nbytes, piece)
    return [pb2.Tensor(name=name, dtype=dtype, shape=shape, data=bytes(view[s:s + piece]), more=True) if s == 0
            else pb2.Tensor(data=bytes(view[s:s + piece]), more=s + piece < view.nbytes) for s in starts]
