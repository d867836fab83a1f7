"""The C plain step (generation/_plainc.c) against the Python step it stands in for: the same chunk bytes
for every token (byte-level splits, invalid UTF-8, every byte, JSON escapes, ids past the table, added
tokens declined), the same state handed back, the same histogram, one list shared with the scrape."""
from __future__ import annotations

import random
import shutil
import sysconfig
import time
from pathlib import Path

import pytest

from protocol import GenerateRequest, PackedLogprobs, RequestOutput, SamplingParams
from protocol.logprobs import pack
from services.frontend.engine_client import engines
from services.frontend.engine_client.inflight import InFlight
from services.frontend.generation import output
from services.frontend.generation.metrics import Metrics
from services.frontend.generation.output import OutputProcessor
from services.frontend.http_api.openai_bodies import ChunkWriter
from services.frontend.model import Model
from services.frontend.requests.engine_request import EngineRequest, OutputOptions

HELLO, COMMA = 9707, 11  # "Hello", ","

needs_c = pytest.mark.skipif(output.PlainStep is None, reason="the C plain step is not built here")


def test_the_c_step_is_built_where_it_can_be() -> None:
    """`pip install` builds it wherever a C compiler and Python's headers are (setup.py: optional)."""
    can = (shutil.which("cc") or shutil.which("gcc")) and Path(sysconfig.get_paths()["include"], "Python.h").exists()
    assert (output.PlainStep is not None and engines.dispatch is not None) or not can


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("tiny", "tiny")


class Pair:
    """Two processors of one request: `ref` takes each step in Python (plain_step), `c` lends its state to
    the C step, whose chunks must be the Python step's text through ChunkWriter.text."""

    def __init__(self, model: Model, *, chat: bool = True, skip: bool = True, prompt: tuple[int, ...] = (1, 2, 3)):
        self.ref, self.metrics_ref = self._processor(model, chat, skip, prompt)
        self.c, self.metrics_c = self._processor(model, chat, skip, prompt)
        self.writer = ChunkWriter("chatcmpl-1", "tiny", chat=chat)
        self.c._last = self.ref._last  # the first token's time, read apart
        native = self.c.native_step(self.writer.text_frame())
        assert native is not None
        self.native = native
        assert self.c.native_load(native)

    @staticmethod
    def _processor(model: Model, chat: bool, skip: bool, prompt: tuple[int, ...]) -> tuple[OutputProcessor, Metrics]:
        request = EngineRequest(GenerateRequest("r1", list(prompt), SamplingParams(max_tokens=1 << 20), time.time()),
                                1 << 20, OutputOptions(chat=chat, stream=True, include_usage=False,
                                                       continuous_usage=False, stop=(),
                                                       include_stop_str_in_output=False, skip_special_tokens=skip,
                                                       tool_choice="none", response_id="chatcmpl-1"))
        stream = InFlight("r1", len(prompt), 1 << 20)
        metrics = Metrics("tiny")
        processor = OutputProcessor(stream, request, tokenizer=model.tokenizer, engines=None,  # type: ignore[arg-type]
                                    metrics=metrics)
        stream.feed(RequestOutput("r1", [HELLO], None))
        processor.take_pieces()  # the first token is process()'s; the steps after it are plain
        return processor, metrics

    def step(self, tid: int, now: float) -> bytes:
        """One token both ways; the C step's chunk (an added token: the Python step's, after the C step
        declined it with nothing done)."""
        out = RequestOutput("r1", [tid], None)
        before = self.native.state()
        chunk = self.native.step(tid, now)
        text = self.ref.plain_step(out, (), now)
        assert text is not None
        if chunk is None:  # an added token: the stream's own step, as the direct stream does
            assert self.native.state() == before
            self.c.native_store(self.native)
            assert self.c.plain_step(out, (), now) == text
            assert self.c.native_load(self.native)
            return self.writer.text(text) if text else b""
        assert chunk == (self.writer.text(text) if text else b""), (tid, text)
        return chunk

    def check_state(self) -> None:
        self.c.native_store(self.native)
        ref, c = self.ref, self.c
        assert (c.completion_tokens, c._last) == (ref.completion_tokens, ref._last)
        assert c._detok.byte_stream.held() == ref._detok.byte_stream.held()  # type: ignore[union-attr]
        assert self.metrics_c.itl.counts == self.metrics_ref.itl.counts
        assert c._detok.flush() == ref._detok.flush()  # what the finish would add


def _byte_tokens(model: Model) -> dict[int, int]:
    """byte -> the id of the token that is that one byte."""
    pieces = output.IncrementalDetokenizer(model.tokenizer, []).byte_stream.pieces  # type: ignore[union-attr]
    return {p[0]: tid for tid, p in enumerate(pieces) if p is not None and len(p) == 1}


@needs_c
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
def test_every_byte_and_every_escape_as_the_python_step(model: Model, chat: bool) -> None:
    pair = Pair(model, chat=chat)
    byte = _byte_tokens(model)
    assert len(byte) == 256
    now = 1000.0
    for b in range(256):  # each byte alone: ASCII (control characters escaped, '"', '\\'), lone and invalid bytes
        now += 0.01
        pair.step(byte[b], now)
        now += 0.01
        pair.step(byte[ord("a")], now)  # closes whatever the byte left open
    pair.check_state()


@needs_c
def test_characters_split_into_bytes_come_whole(model: Model) -> None:
    """Every UTF-8 length, one byte a step, invalid sequences among them (a truncated character, a
    surrogate's prefix, an overlong form, bytes no UTF-8 has)."""
    pair = Pair(model)
    byte = _byte_tokens(model)
    text = "aé€𓀀\u2028\x7f\"\\\n" + "".join(chr(c) for c in range(0x80, 0x3000, 97)) + "😀" * 3
    data = text.encode() + b"\xe2\x82A\xed\xa0\x80B\xc0\xafC\xff\xfe\xf4\x90\x80\x80D\xf0\x9f\x98"
    now = 50.0
    chunks = []
    for b in data:
        now += 0.02
        chunks.append(pair.step(byte[b], now))
    assert b"".join(chunks).count("😀".encode()) == 3
    pair.check_state()  # the last character open: held, then flushed as U+FFFD


@needs_c
def test_ids_past_the_table_decode_to_nothing_and_added_tokens_go_to_python(model: Model) -> None:
    pair = Pair(model)
    pieces = pair.c._detok.byte_stream.pieces  # type: ignore[union-attr]
    added = [tid for tid, p in enumerate(pieces) if p is None]
    special = {tid for tid, added_token in model.tokenizer.get_added_tokens_decoder().items() if added_token.special}
    assert added and special and set(added) - special  # special ones skipped, the others' content shown
    byte = _byte_tokens(model)
    now = 7.0
    for tid in [byte[0xE2], -1, len(pieces), 1 << 40, 1 << 70, -(1 << 70), byte[0x82], byte[0xAC], *added[:40],
                byte[0xF0], added[0], byte[0x9F], HELLO]:
        now += 0.005
        pair.step(tid, now)
    pair.check_state()


@needs_c
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_random_mix_as_the_python_step(model: Model, seed: int) -> None:
    """Long pieces (past the C step's 64-byte buffer), bytes, added tokens, ordinary ids, ids past the
    table; gaps from 0 to past every bucket."""
    pair = Pair(model, skip=bool(seed % 2))
    pieces = pair.c._detok.byte_stream.pieces  # type: ignore[union-attr]
    rng = random.Random(seed)
    byte = list(_byte_tokens(model).values())
    longest = sorted(range(len(pieces)), key=lambda t: -len(pieces[t] or b""))[:20]
    added = [tid for tid, p in enumerate(pieces) if p is None]
    pool = [byte, longest, added, [-5, len(pieces) + 3, 1 << 80]]
    now = 0.0
    for _ in range(3000):
        now += rng.choice([0.0, 0.0004, 0.003, 0.02, 0.07, 0.3, 3.0, 150.0])
        kind = rng.random()
        tid = (rng.randrange(len(pieces)) if kind < 0.5 else rng.choice(pool[int((kind - 0.5) * 8)]))
        pair.step(tid, now)
    pair.check_state()


@needs_c
def test_the_histogram_s_list_is_shared_with_the_scrape(model: Model) -> None:
    """A flush between steps (a scrape) empties the list in place: the C step's later counts still reach
    the registry, and none is counted twice."""
    pair = Pair(model)
    registry, count = pair.metrics_c.registry, "vllm:inter_token_latency_seconds_count"
    labels = {"model_name": "tiny"}
    now = pair.native.state()[1]  # the first token's time
    for i in range(1, 6):
        now += 0.015
        pair.native.step(HELLO, now)
        assert registry.get_sample_value(count, labels) == i
    assert registry.get_sample_value("vllm:inter_token_latency_seconds_sum", labels) == pytest.approx(5 * 0.015)
    assert registry.get_sample_value("vllm:inter_token_latency_seconds_bucket", {**labels, "le": "0.02"}) == 5


@needs_c
def test_the_c_step_refuses_what_is_not_its_shape(model: Model) -> None:
    pair = Pair(model)
    with pytest.raises(TypeError):
        pair.native.step(HELLO)  # type: ignore[call-arg]
    assert pair.native.step("7", 1.0) is None  # not an int: declined, nothing done
    with pytest.raises(ValueError, match="counts must hold one count per bound"):
        output.PlainStep([b"a"], [1.0, float("inf")], [0, 0], b"", b"")
    with pytest.raises(TypeError, match="piece must be bytes"):
        output.PlainStep(["a"], [float("inf")], [0, 0.0], b"", b"").step(0, 1.0)


@needs_c
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_chunks_sent_on_the_socket_keep_their_order_past_a_full_kernel_buffer(loop: str) -> None:
    """The C write pass sends a step's chunk on the socket itself while the transport holds nothing back;
    past the kernel's buffers the rest of a chunk goes to the transport's write, later chunks through it,
    and once the transport pauses the protocol they are refused (the stream lets go): what the client reads
    is every accepted chunk, whole and in order."""
    import asyncio
    import socket

    import uvloop

    from services.frontend.http_api.direct_stream import HttpOutlet

    class Flow:
        write_paused = False

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport, self.flow, self.disconnected = transport, Flow(), False
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            made.set_result(self)

        def pause_writing(self) -> None:
            self.flow.write_paused = True

    async def run() -> tuple[bytes, list[bytes], list[bytes]]:
        nonlocal made
        made = asyncio.get_running_loop().create_future()
        server = await asyncio.get_running_loop().create_server(Server, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        cycle = await made
        cycle_target, fd = HttpOutlet(cycle).native_target()  # type: ignore[arg-type]
        assert fd >= 0
        step = output.PlainStep([b"a"], [float("inf")], [0, 0.0], b"", b"")
        writing: list[object] = []
        step.bind(object(), object(), writing, cycle_target, fd)
        accepted, refused = [], []
        for i in range(20):  # ~10 MB, nothing read meanwhile; chunks larger and smaller than the buffers
            body = b"data: %d " % i + bytes([97 + i % 26]) * (1500 if i % 2 else 1_000_000) + b"\n\n"
            step.queue(body)
            left = output.write_pass(writing[:])
            writing.clear()
            (refused if left else accepted).append(body)
        assert accepted and refused  # the kernel's buffers filled, then the transport's, then it paused
        data = b""
        expected = b"".join(b"%x\r\n%b\r\n" % (len(b), b) for b in accepted)
        while len(data) < len(expected):
            data += await asyncio.wait_for(reader.read(1 << 16), 10)
        writer.close()
        server.close()
        return data, accepted, refused

    made: asyncio.Future[Server] | None = None
    data, accepted, refused = uvloop.run(run()) if loop == "uvloop" else asyncio.run(run())
    assert data == b"".join(b"%x\r\n%b\r\n" % (len(b), b) for b in accepted)
    assert len(accepted) + len(refused) == 20


# ---- with logprobs (a chat completion's top_logprobs) ----


class LogprobsPair:
    """Two chat processors with `top` alternatives per token: `ref` steps in Python, `c` lends its state
    to a C step that makes each step's entry too. The C step goes first each time, so an id seen for the
    first time meets cells not made yet (declined: the stream's Python step makes them, as the direct
    stream's _native_other)."""

    def __init__(self, model: Model, top: int, *, as_ids: bool = False) -> None:
        self.ref, self.metrics_ref = self._processor(model, top, as_ids)
        self.c, self.metrics_c = self._processor(model, top, as_ids)
        self.writer = ChunkWriter("chatcmpl-1", "tiny", chat=True)
        self.c._last = self.ref._last
        around = self.c.formatter.render_frame()  # type: ignore[union-attr]
        assert around is not None
        native = self.c.native_step(self.writer.logprobs_frame(*around))
        assert native is not None
        self.native = native
        self.lent = self.c.native_load(native)
        self.made = self.declined = 0

    @staticmethod
    def _processor(model: Model, top: int, as_ids: bool) -> tuple[OutputProcessor, Metrics]:
        request = EngineRequest(GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=1 << 20), time.time()),
                                1 << 20, OutputOptions(chat=True, stream=True, include_usage=False,
                                                       continuous_usage=False, stop=(),
                                                       include_stop_str_in_output=False, skip_special_tokens=True,
                                                       tool_choice="none", response_id="chatcmpl-1", logprobs=top,
                                                       return_tokens_as_token_ids=as_ids))
        stream = InFlight("r1", 3, 1 << 20)
        metrics = Metrics("tiny")
        processor = OutputProcessor(stream, request, tokenizer=model.tokenizer, engines=None,  # type: ignore[arg-type]
                                    metrics=metrics)
        frame = pack([HELLO] * (top + 1), [-0.5] * (top + 1), [1])
        stream.feed(RequestOutput("r1", [HELLO], None, packed_logprobs=PackedLogprobs(0, 0, 1, top)), [frame])
        processor.take_pieces()
        return processor, metrics

    def _python(self, processor: OutputProcessor, out: RequestOutput, frames: list[bytes], now: float) -> bytes | None:
        text = processor.plain_step(out, frames, now)
        if text is None:
            return None
        if not text:
            return b""
        render = processor.formatter.render  # type: ignore[union-attr]
        return self.writer.text(text, None, render(processor.logprobs[0]) if processor.logprobs[0] else None)

    def step(self, tid: int, now: float, frame: bytes, ref: PackedLogprobs) -> bytes | None:
        """One token both ways: the C step's chunk, or the Python step's after the C step declined (None when
        the Python step takes no plain step either: not such an output); the two must be the same bytes."""
        out = RequestOutput("r1", [tid], None, packed_logprobs=ref)
        frames = [frame]
        chunk = None
        if self.lent:
            before = self.native.state()
            chunk = self.native.step(tid, now, ref, frames)
            if chunk is None:
                assert self.native.state() == before  # declined: nothing done
                self.declined += 1
                self.c.native_store(self.native)
                self.lent = False
            else:
                self.made += 1
        expected = self._python(self.ref, out, frames, now)  # None for a row unpack() refuses (process() reports it)
        if chunk is None:
            chunk = self._python(self.c, out, frames, now)
            self.lent = self.c.native_load(self.native)
        assert chunk == expected, (tid, chunk, expected)
        return chunk

    def check_state(self) -> None:
        if self.lent:
            self.c.native_store(self.native)
            self.lent = False
        ref, c = self.ref, self.c
        assert (c.completion_tokens, c._last) == (ref.completion_tokens, ref._last)
        assert c._detok.byte_stream.held() == ref._detok.byte_stream.held()  # type: ignore[union-attr]
        assert c._pending == ref._pending
        assert c.formatter._context == ref.formatter._context  # type: ignore[union-attr]
        assert self.metrics_c.itl.counts == self.metrics_ref.itl.counts


_LOGPROBS = [-0.0, 0.0, -1e-7, -1.5e-5, -0.0001, -1e-5, -0.6931471824645996, -3.25, -17.0, -123.456, -9998.5,
             -1e-30, -1e-45, 1e-3, 5.0]
_FLOORED = [-9999.0, -10000.0, -1e30, float("-inf"), float("nan"), float("inf")]


@needs_c
@pytest.mark.parametrize(("top", "seed", "as_ids"), [(5, 0, False), (5, 1, False), (0, 2, False), (1, 3, False),
                                                      (20, 4, False), (25, 5, False), (5, 6, True)])
def test_logprobs_steps_as_the_python_step(model: Model, top: int, seed: int, as_ids: bool) -> None:
    """Random steps: common ids, ids seen for the first time, bytes that end inside a character (held
    entries; ids whose string depends on the next: the context), added tokens, every logprob magnitude and
    those to floor, a row whose k or positions differ, negative ids, frames too short, offsets."""
    pair = LogprobsPair(model, top, as_ids=as_ids)
    rng = random.Random(seed)
    pieces = pair.c._detok.byte_stream.pieces  # type: ignore[union-attr]
    byte = list(_byte_tokens(model).values())
    common = [rng.randrange(len(pieces)) for _ in range(40)]
    added = [tid for tid, p in enumerate(pieces) if p is None]
    now = 100.0
    for i in range(2500):
        now += rng.choice([0.0, 0.003, 0.02, 0.3])
        kind = rng.random()
        tid = (rng.choice(common) if kind < 0.5 else rng.choice(byte) if kind < 0.8
               else rng.randrange(len(pieces)) if kind < 0.95 else rng.choice(added))
        alts = [rng.choice(common) if rng.random() < 0.97 else rng.randrange(len(pieces) + 50) for _ in range(top)]
        if rng.random() < 0.1 and alts:
            alts[rng.randrange(top)] = tid  # the token among its alternatives
        lps = [rng.choice(_LOGPROBS) if rng.random() < 0.2 else -rng.random() * 10 ** rng.randrange(-8, 4)
               for _ in range(top + 1)]
        ref = PackedLogprobs(0, 0, 1, top)
        odd = rng.random()
        if odd < 0.02:
            lps[rng.randrange(top + 1)] = rng.choice(_FLOORED)
        frame = pack([tid, *alts], lps, [rng.randrange(1, 9)])
        if 0.02 <= odd < 0.03:
            frame = frame[:-4]  # too short
        elif 0.03 <= odd < 0.04:
            alts[0:1] = [-3] if alts else []  # a negative id
            frame = pack([tid, *alts] if alts else [-3], lps, [1])
        elif 0.04 <= odd < 0.05:
            frame, ref = b"\0" * 8 + frame, PackedLogprobs(0, 8, 1, top)  # at an offset
        elif 0.05 <= odd < 0.06 and top:
            ref = PackedLogprobs(0, 0, 1, top - 1)  # fewer alternatives than asked: _chat_rows'
            frame = pack([tid, *alts[:-1]], lps[:-1], [1])
        elif 0.06 <= odd < 0.07:
            ref = PackedLogprobs(1, 0, 1, top)  # a frame the message does not have
        pair.step(tid, now, frame, ref)
        if i % 500 == 499:
            pair.check_state()
            pair.lent = pair.c.native_load(pair.native)
    pair.check_state()
    assert pair.made > 500 and pair.declined > 100  # both ways taken, often


@needs_c
def test_logprobs_entries_held_for_the_next_text_go_out_with_it(model: Model) -> None:
    """A character split into bytes: no text till it is whole, so its bytes' entries are held; those
    steps are the Python step's (an id whose text alone ends inside a character is in the table's
    `partial`), and the held entries, handed to the C step when it takes the stream again, go out in the
    chunk of the next text, before its own entry."""
    pair = LogprobsPair(model, 2)
    byte = _byte_tokens(model)
    now = 5.0

    def step(tid: int) -> bytes | None:
        nonlocal now
        now += 0.02
        return pair.step(tid, now, pack([tid, HELLO, COMMA], [-0.1, -0.2, -0.3], [1]), PackedLogprobs(0, 0, 1, 2))

    for tid in [HELLO, COMMA, COMMA]:  # the cells made, then made in C
        step(tid)
    made = pair.made
    chunks = [step(byte[b]) for b in "😀é".encode()]
    assert chunks[0] == b"" and chunks[3].count(b'"token":') == 4 * 3  # 😀's four bytes' entries, 3 cells each
    assert pair.made == made  # each byte's id ends inside a character
    assert not pair.lent  # é's last byte alone ends inside a character: the next entry depends on it
    step(HELLO)  # the Python step's, after which nothing before matters
    made = pair.made
    # Entries held as the C step takes the stream (a held byte's, say): its next chunk carries them first.
    pair.check_state()
    held = [b'{"token":"x","logprob":-1.0,"bytes":[120],"top_logprobs":[]}']
    pair.ref._pending, pair.c._pending = list(held), list(held)
    assert pair.c.native_load(pair.native)
    pair.lent = True
    chunk = step(HELLO)
    assert pair.made == made + 1 and chunk is not None and b'"content":[' + held[0] + b',{"token":"Hello"' in chunk
    pair.check_state()
