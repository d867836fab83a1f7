"""Weight-update sessions and the tensors of one update_weights call read from its raw frames."""
from __future__ import annotations

import struct

import pytest

from services.engine.weights import INITIAL_VERSION, WeightSession, WeightUpdateError, views


def spec(name: str = "w", dtype: str = "float32", shape: list[int] | None = None, frame: int = 0,
         offset: int = 0, nbytes: int | None = None) -> dict:  # type: ignore[type-arg]
    shape = [2, 2] if shape is None else shape
    n = 1
    for d in shape:
        n *= d
    return {"name": name, "dtype": dtype, "shape": shape, "frame": frame, "offset": offset,
            "nbytes": n * 4 if nbytes is None else nbytes}


def test_views_slice_their_frames_without_a_copy() -> None:
    a = bytearray(struct.pack("<4f", 1, 2, 3, 4) + struct.pack("<2e", 5, 6))
    b = b"\x01\x02"
    out = views([spec("a"), spec("h", "float16", [2], offset=16, nbytes=4), spec("b", "uint8", [2], frame=1,
                                                                                  nbytes=2)], [a, b])
    assert [(t.name, t.dtype, t.shape, len(t.data)) for t in out] == [
        ("a", "float32", (2, 2), 16), ("h", "float16", (2,), 4), ("b", "uint8", (2,), 2)]
    assert out[0].data.cast("f").tolist() == [1, 2, 3, 4]
    a[0:4] = struct.pack("<f", 9)  # a view, not a copy
    assert out[0].data.cast("f")[0] == 9
    assert bytes(out[2].data) == b


@pytest.mark.parametrize(("tensor", "message"), [
    (spec(dtype="float31"), "tensors[0] ('w'): dtype 'float31' is not one of float64, float32"),
    (spec(nbytes=15), "tensors[0] ('w'): nbytes 15 != 4 elements of shape [2, 2] x 4 bytes (float32)"),
    (spec(shape=[-1, 2], nbytes=-8), "shape [-1, 2] has a negative dimension"),
    (spec(frame=2), "frame 2 is not one of the call's 1 raw frame(s)"),
    (spec(offset=4), "bytes [4, 20) lie outside frame 0 (16 bytes)"),
    (spec(offset=-1), "bytes [-1, 15) lie outside frame 0"),
    (spec(name=""), "tensors[0].name must not be empty"),
])
def test_views_refuse_tensors_that_do_not_match_their_frames(tensor: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(WeightUpdateError) as err:
        views([tensor], [bytes(16)])
    assert message in str(err.value)


def test_session_order_and_counts() -> None:
    s = WeightSession()
    assert s.version == INITIAL_VERSION == "0"
    with pytest.raises(WeightUpdateError, match="update_weights: no weight update is open; call start_weight_update"):
        s.require_open("update_weights")
    with pytest.raises(WeightUpdateError, match="finish_weight_update: no weight update is open"):
        s.finish("v1")
    s.start()
    with pytest.raises(WeightUpdateError, match=r"already open \(0 tensor\(s\), 0 bytes received\)"):
        s.start()
    assert s.received(views([spec(), spec("x")], [bytes(16)])) == {"tensors": 2, "bytes": 32}
    with pytest.raises(WeightUpdateError, match="version must not be empty"):
        s.finish("")
    assert s.finish("v1") == {"version": "v1"}
    assert (s.version, s.open, s.tensors, s.bytes) == ("v1", False, 2, 32)
    s.start()  # a new session after a finish
    assert s.tensors == 0


def test_a_tensor_sent_twice_in_one_update_is_refused_before_any_is_counted() -> None:
    """vLLM's layerwise reload counts a layer's tensors to know it is complete: a repeat would complete it
    before its last tensor came (the vllm backend's session). The sim's counts them."""
    loose = WeightSession()
    loose.start()
    assert loose.received(views([spec("a"), spec("a")], [bytes(16)]))["tensors"] == 2
    s = WeightSession(once_each=True)
    s.start()
    s.received(views([spec("a")], [bytes(16)]))
    for names in (["b", "a"], ["c", "c"]):
        with pytest.raises(WeightUpdateError, match=r"already sent in this update"):
            s.received(views([spec(n) for n in names], [bytes(16)]))
    assert (s.tensors, s.names) == (1, {"a"})
    s.finish("v1")
    s.start()  # a new update may send it again
    assert s.received(views([spec("a")], [bytes(16)])) == {"tensors": 1, "bytes": 16}
