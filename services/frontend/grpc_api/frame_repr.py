"""hyperframe's DATA frame repr made cheap: h2 takes repr() of every frame it receives (for a trace log
that is off), and hyperframe's hexlifies a DATA frame's whole body to show its first 10 bytes, which
made a relayed weight update's megabytes cost twice. Same string, from the first bytes only. Imported by
the gRPC port (grpc_port.py), on API server 0."""
from __future__ import annotations

from typing import Any

from hyperframe import frame as _frame

_SHOWN = 11  # _raw_data_repr shows 20 hex digits and "..." past them: 11 bytes tell both apart


def _data_body_repr(self: Any) -> str:
    head = self.serialize_padding_data() + bytes(self.data[:_SHOWN])
    if len(head) < _SHOWN and self.pad_length:
        head += b"\0" * min(self.pad_length, _SHOWN - len(head))
    return _frame._raw_data_repr(head[:_SHOWN])


_frame.DataFrame._body_repr = _data_body_repr  # type: ignore[method-assign]
