"""The cheap DATA frame repr (grpc_api/frame_repr.py) is hyperframe's own string, padded or not, for
bodies shorter and longer than what the repr shows."""
from __future__ import annotations

import pytest
from hyperframe import frame

from services.frontend.grpc_api import frame_repr


@pytest.mark.parametrize("data", [b"", b"a", b"0123456789", b"0123456789a", b"\x00\xff" * 7, bytes(range(256)) * 64])
@pytest.mark.parametrize("pad", [None, 0, 1, 5, 30])
def test_the_same_string_as_hyperframes(data: bytes, pad: int | None) -> None:
    f = frame.DataFrame(1, data)
    if pad is not None:
        f.flags.add("PADDED")
        f.pad_length = pad
    assert frame_repr._data_body_repr(f) == frame.Frame._body_repr(f)
    assert frame.DataFrame._body_repr is frame_repr._data_body_repr
