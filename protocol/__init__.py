"""Engine protocol shared by every service: versioned, order-defined msgpack structs and framing.

Pure by design: stdlib, msgpack (through msgspec's encoder) and nothing that touches a socket.
"""
from __future__ import annotations

from protocol.errors import ProtocolError
from protocol.framing import Frames, decode, encode, peek_header
from protocol.handshake import RejectCode, check_hello, make_hello
from protocol.messages import (
    ERROR_DRAINING,
    ERROR_ENGINE,
    ERROR_INVALID,
    ITERATION_TOKENS_BUCKETS,
    MESSAGE_TYPES,
    Abort,
    AllCleared,
    BlockRemoved,
    BlockStored,
    EngineDead,
    GenerateRequest,
    Heartbeat,
    Hello,
    Logprobs,
    Message,
    Outputs,
    PackedLogprobs,
    PackedPooled,
    PoolingParams,
    Ready,
    Reject,
    RequestOutput,
    RequestTimings,
    SamplingParams,
    Stats,
    UtilityCall,
    UtilityResult,
)
from protocol.version import MAJOR, MINOR

__all__ = [
    "ERROR_DRAINING",
    "ERROR_ENGINE",
    "ERROR_INVALID",
    "ITERATION_TOKENS_BUCKETS",
    "MAJOR",
    "MESSAGE_TYPES",
    "MINOR",
    "Abort",
    "AllCleared",
    "BlockRemoved",
    "BlockStored",
    "EngineDead",
    "Frames",
    "GenerateRequest",
    "Heartbeat",
    "Hello",
    "Logprobs",
    "Message",
    "Outputs",
    "PackedLogprobs",
    "PackedPooled",
    "PoolingParams",
    "ProtocolError",
    "Ready",
    "Reject",
    "RejectCode",
    "RequestOutput",
    "RequestTimings",
    "SamplingParams",
    "Stats",
    "UtilityCall",
    "UtilityResult",
    "check_hello",
    "decode",
    "encode",
    "make_hello",
    "peek_header",
]
