"""Output processing: the only code that loops over a request's engine outputs (detokenize, stop
strings, finish, usage, metrics, a request that a draining, unreachable or dying rank did not start
placed again). Runs on each API server's event loop, one OutputProcessor per request, in one pass over
each batch of queued outputs.

Per output: detokenize -> stop strings -> the request's OutputParser (reasoning and tool-call parsers,
incremental state machines fed one decoded delta at a time: services/frontend/parsers/) -> pieces
for the writers. A TokenOutputParser (gpt-oss harmony, whose markers are special tokens) takes the
output's token ids in place of all three: it decodes its own messages, and the request has no
stop strings (translation refuses them). A piece is plain content text (a str: the only kind
without a parser, so that path pays nothing for parsing) or a ParsedDelta carrying reasoning and
tool-call deltas.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from tokenizers import Tokenizer

from protocol import ERROR_DRAINING, ERROR_INVALID, ProtocolError, RequestOutput, RequestTimings
from protocol.logprobs import Segment, unpack
from services.frontend.engine_client.inflight import CLIENT_GONE, LOST, NOT_SENT, EngineFailure, InFlight
from services.frontend.generation.metrics import Metrics, Parent
from services.frontend.generation.request_trace import RequestTrace
from services.frontend.parsers import OutputParser, ParsedDelta, TokenOutputParser, ToolCall
from services.frontend.requests.engine_request import EngineRequest, OutputOptions, refused_field
from services.frontend.text.detokenizer import IncrementalDetokenizer
from services.frontend.text.logprobs_format import Entry, LogprobsFormatter
from services.frontend.text.stop_strings import StopChecker
from services.frontend.text.token_strings import token_strings

try:  # built by `pip install` where a C compiler is (setup.py); else the Python step serves every token
    from services.frontend.generation._plainc import PlainStep, write_pass
except ImportError:  # pragma: no cover - a host without the extension
    PlainStep = write_pass = None  # type: ignore[assignment,misc]


def usage_body(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """A response's usage, in OpenAI's shape (the writers' and output processing's)."""
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


class EnginePort(Protocol):
    """What output processing may ask of the engines serving its request."""

    def abort(self, stream: InFlight) -> None:
        """Stop the request at its engine (a stop string matched)."""

    def place_again(self, stream: InFlight, request: EngineRequest, exclude: set[int]) -> bool:
        """Send it to an engine whose index is not in `exclude`; False when none can take it."""


Piece = str | ParsedDelta  # content text, or a parser's delta with reasoning or tool calls
# Refusals that prove the rank never started the request, or failures of a rank before it sent anything for
# it (its client has seen nothing of it): another rank may serve it.
_ELSEWHERE = (ERROR_DRAINING, NOT_SENT, LOST)


class OutputProcessor:
    """One request's engine outputs turned into text pieces, with its counts, timings and metrics.

    Call pieces() until `finish` is set. It records the request's metrics when it ends, also when it
    fails (EngineFailure), so the writers only write."""

    __slots__ = ("_detok", "_echo", "_echo_entries", "_engines", "_first", "_last", "_metrics", "_no_text", "_parent",
                 "_parser", "_pending", "_plain", "_request", "_start", "_stops", "_timings", "_token_parser", "_trace",
                 "_tried",
                 "cached_tokens", "calls",
                 "completion_tokens", "counts", "finish", "formatter", "logprobs", "options", "prompt_segments",
                 "stop_reason", "stream", "tail_logprobs", "token_ids")

    def __init__(self, stream: InFlight, request: EngineRequest, *, tokenizer: Tokenizer, engines: EnginePort,
                 metrics: Metrics, parser: OutputParser | TokenOutputParser | None = None,
                 parent: Parent | None = None, trace: RequestTrace | None = None) -> None:
        self.stream, self._request, self._engines, self._metrics = stream, request, engines, metrics
        self._trace = trace  # its span, when tracing is on (request_trace.py)
        self._parent = parent  # the request of n choices this is one of
        self.options: OutputOptions = request.output
        self._detok = IncrementalDetokenizer(tokenizer, request.request.prompt_token_ids,
                                             skip_special_tokens=self.options.skip_special_tokens)
        stops = self.options.stop
        self._stops = (StopChecker(stops, include_stop_str_in_output=self.options.include_stop_str_in_output)
                       if stops else None)
        self._parser: OutputParser | None = None
        self._token_parser: TokenOutputParser | None = None
        # Token-out with no text asked and no stop string to match: nothing reads the text, so it is not
        # decoded (the token-in routes' common case: a gateway or an RL loop that wants ids).
        self._no_text = self.options.token_out and not self.options.text_out and not stops and parser is None
        if parser is not None and isinstance(parser, TokenOutputParser):  # a Protocol's isinstance is slow
            self._token_parser = parser
        else:
            self._parser = parser
        self.calls: list[ToolCall] = []  # the tool calls the parser found, once finished
        self._tried: set[int] = set()  # engine indexes that refused it while draining
        self._start = time.monotonic()
        self._first = self._last = 0.0  # when the first and the latest tokens arrived
        self._timings: RequestTimings | None = None  # the engine's, as of the first token (protocol 1.4)
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish: str | None = None
        self.stop_reason: int | str | None = None
        self.counts: list[int] = []  # completion tokens so far at each of the latest pieces
        # Token-out requests (options.token_out): the ids of the latest pieces() call, every id the engine
        # produced (the EOS or stop token too, as vLLM's token_ids), up to the one that matched a stop string.
        self.token_ids: list[int] = []
        # Logprobs (when asked): each of the latest pieces' entries (the formatter's), which are those of
        # the tokens that came since the piece before it; at finish, the entries no piece took.
        options = self.options
        self.formatter: LogprobsFormatter | None = None
        if options.logprobs is not None or options.prompt_logprobs is not None:
            self.formatter = LogprobsFormatter(token_strings(tokenizer), chat=options.chat, top=options.logprobs or 0,
                                               token_out=options.token_out,
                                               as_token_ids=options.return_tokens_as_token_ids)
            stream.keeps_frames = True
        if self._no_text and not options.stream and self.formatter is None:
            # ... and with one answer at the end, nothing to do per token either: woken at the first token
            # and the end only. Not with logprobs: each waiting output would keep its step's frames alive.
            stream.interval = 1 << 62
        self.logprobs: list[list[Entry]] = []
        self.tail_logprobs: list[Entry] = []
        self.prompt_segments: list[Segment] = []
        self._pending: list[Entry] = []
        self._echo = options.echo  # not yet sent
        # plain_text() serves its steps: the text path has nothing to do but detokenize (and, with
        # logprobs, format the step's entries).
        self._plain = (parser is None and self._stops is None and not options.echo and not options.token_out
                       and (self.formatter is None or options.prompt_logprobs is None))
        self._echo_entries: list[Entry] | None = None  # made once, before the first token's

    async def pieces(self) -> list[Piece]:
        """Text of everything the engine produced since the last call; sets `finish` when done.
        Raises EngineFailure when the engine failed or refused the request, or the client left."""
        try:
            outs = await self.stream.next()
        except EngineFailure:
            self._failed()
            raise
        return self.process(outs)

    def take_pieces(self) -> list[Piece]:
        """pieces() of the outputs queued now, without waiting: a sink's (InFlight.Sink) in the dispatch
        pass. Raises EngineFailure as pieces() does for a failed output."""
        return self.process(self.stream.take())

    def plain_text(self) -> str | None:
        """process() of the one output queued, when it is a plain step: tokens after the first, no
        finish or error, and a request with no stop strings, parser, echo, prompt_logprobs or token ids
        out, the case of nearly every token of a stream; its text (perhaps ""). With logprobs, `logprobs`
        holds the text's entries as process() leaves them. None: not such a step, nothing taken
        (take_pieces() serves it)."""
        if not self._plain or self.completion_tokens == 0:
            return None
        pending = self.stream.pending
        if len(pending) != 1:
            return None
        out = pending[0]
        n = len(out.new_token_ids)
        if not n or out.finish_reason is not None:
            return None
        if self.formatter is not None:
            return self._plain_logprobs(out)
        self.stream.take_one()
        return self._text_step(out.new_token_ids, time.monotonic())

    def plain_steps(self) -> bool:
        """plain_step() may serve this stream's steps: those plain_text() serves."""
        return self._plain and self.completion_tokens > 0

    def plain_step(self, out: RequestOutput, raw_frames: Sequence[bytes], now: float) -> str | None:
        """plain_text() of a plain step handed straight from the dispatch pass (InFlight.plain), never
        queued: `raw_frames` its message's frames after the body (its packed logprobs), `now` when the
        message was read. Only where plain_steps() says so, for an output with tokens and no finish.
        None: not such a step after all (a logprobs segment missing or unreadable), nothing done."""
        ids = out.new_token_ids
        if self.formatter is not None:
            ref = out.packed_logprobs
            if ref is None or out.packed_prompt_logprobs is not None:
                return None
            try:
                seg = unpack(raw_frames, ref)
            except ProtocolError:
                return None  # process() fails the request with the engine's fault named
            self.stream.generated += len(ids)
            return self._logprobs_step(seg, ids, now)
        self.stream.generated += len(ids)
        return self._text_step(ids, now)

    def native_step(self, frame: tuple[bytes, ...]) -> PlainStep | None:
        """A C step for this stream's plain steps (generation/_plainc.c). Without logprobs, `frame` is
        (prefix, suffix): each chunk prefix + the text's JSON string + suffix, as ChunkWriter.text()
        makes it; with a chat completion's logprobs, (prefix, mid, suffix): the step's entries (those
        held, then its own) between mid and suffix, commas between (ChunkWriter.logprobs_frame()).
        None where the extension is not built, the tokenizer's decoder is not ByteLevel, or the logprobs
        are not a chat completion's (the formatter's native_cells()). Takes no state: native_load()
        lends it the stream's, native_store() takes it back."""
        if PlainStep is None or self._detok.byte_stream is None:
            return None
        itl, pieces = self._metrics.itl, self._detok.byte_stream.pieces
        if self.formatter is None:
            return PlainStep(pieces, itl.bounds, itl.counts, *frame) if len(frame) == 2 else None
        cells = self.formatter.native_cells()
        if cells is None or len(frame) != 3:
            return None
        heads, tails, partial = cells
        prefix, mid, suffix = frame
        return PlainStep(pieces, itl.bounds, itl.counts, prefix, suffix, heads=heads, tails=tails, partial=partial,
                         top=self.formatter.top, mid=mid)

    def native_load(self, native: PlainStep) -> bool:
        """Lend the stream's state to `native` (native_step()'s) where its steps are plain_step()'s and
        the detokenizer holds nothing of the prompt's; until native_store(), `native` owns the count,
        the latest token's time and the held bytes, and only its step() may make a step."""
        held = self._detok.byte_stream.held() if self._detok.byte_stream is not None else None
        if held is None or not self.plain_steps():
            return False
        if self.formatter is not None and not self.formatter.context_free():
            return False  # the Python step's, till no token before the next ends inside a character
        native.load(self.completion_tokens, self._last, held, self._pending)
        return True

    def native_store(self, native: PlainStep) -> None:
        """Take back the state native_load() lent."""
        self.completion_tokens, self._last, held, self._pending = native.state()
        self._detok.byte_stream.hold(held)  # type: ignore[union-attr]  # native_load() checked it
        self.counts, self.logprobs = [], []

    def _text_step(self, ids: Sequence[int], now: float) -> str:
        """A plain step without logprobs: its latency, count and text."""
        self._metrics.itl.observe(now - self._last)
        self._last = now
        tokens = self.completion_tokens = self.completion_tokens + len(ids)
        text = self._detok.push_one(ids[0]) if len(ids) == 1 else self._detok.push(ids)
        self.counts = [tokens] if text else []
        return text

    def plain_texts(self) -> list[str] | None:
        """plain_text() of several plain steps queued at once (the loop ran a step or more late): each
        step's text, in order, those that have any, as process() makes them, with one inter-token latency
        per step and `counts` per text. None: not all plain (or logprobs asked), nothing taken."""
        if not self._plain or self.completion_tokens == 0 or self.formatter is not None:
            return None
        pending = self.stream.pending
        for out in pending:
            if not out.new_token_ids or out.finish_reason is not None:
                return None
        self.stream.take()
        # process()'s clock: one reading for the batch, so the steps after the first have a latency of 0.
        now = time.monotonic()
        observe, push = self._metrics.itl.observe, self._detok.push
        texts: list[str] = []
        counts = self.counts = []
        tokens = self.completion_tokens
        for out in pending:
            observe(now - self._last)
            self._last = now
            tokens += len(out.new_token_ids)
            text = push(out.new_token_ids)
            if text:
                texts.append(text)
                counts.append(tokens)
        self.completion_tokens = tokens
        return texts

    def _plain_logprobs(self, out: RequestOutput) -> str | None:
        """plain_text() of a step with logprobs."""
        ref = out.packed_logprobs
        if ref is None or out.packed_prompt_logprobs is not None:
            return None
        try:
            seg = unpack(self.stream.pending_frames[0], ref)
        except ProtocolError:
            return None  # process() fails the request with the engine's fault named
        self.stream.take()
        return self._logprobs_step(seg, out.new_token_ids, time.monotonic())

    def _logprobs_step(self, seg: Segment, ids: Sequence[int], now: float) -> str:
        """A plain step with logprobs, its segment read: its entries wait for the next text, as in process()."""
        self._metrics.itl.observe(now - self._last)
        self._last = now
        self.completion_tokens += len(ids)
        entries = self.formatter.sampled(seg)  # type: ignore[union-attr]  # a logprobs step has one
        text = self._detok.push_one(ids[0]) if len(ids) == 1 else self._detok.push(ids)
        if text:
            self.counts = [self.completion_tokens]
            if self._pending:
                entries = self._pending + entries
                self._pending = []
            self.logprobs = [entries]
        else:
            self.counts, self.logprobs = [], []
            self._pending += entries
        return text

    def _failed(self) -> None:
        """The stream failed (its engine, or the client left): the metrics of an aborted or failed request."""
        m = self._metrics
        # As vLLM: a client that left aborted its request; the tokens made before still count.
        m.generation_tokens.inc(self.completion_tokens)
        m.request_done(self.stream.prompt_len, self.completion_tokens, self._request.max_tokens, self._parent)
        m.finished("abort" if self.stream.gone == CLIENT_GONE else "error")
        if self._trace is not None:
            self._trace.fail("the client left" if self.stream.gone == CLIENT_GONE else "the engine failed",
                             self.completion_tokens)

    def process(self, outs: list[RequestOutput]) -> list[Piece]:
        """The pieces of these outputs (pieces() after its wait); sets `finish` when done."""
        m = self._metrics
        now = time.monotonic()
        detok, stops, parser, token_parser = self._detok, self._stops, self._parser, self._token_parser
        skip_text = self._no_text
        drop_stop_token = not self.options.include_stop_str_in_output
        formatter = self.formatter
        pieces: list[Piece] = []
        counts = self.counts = []
        ids: list[int] | None = None
        if self.options.token_out:
            ids = self.token_ids = []
        self.logprobs = []
        for i, out in enumerate(outs):
            n = len(out.new_token_ids)
            if formatter is not None:
                self._take_logprobs(out, self.stream.raw_frames[i], formatter)
            if n:
                if self.completion_tokens == 0:
                    m.ttft.observe(now - self._start)
                    self.cached_tokens = out.num_cached_tokens
                    self._first, self._timings = now, out.timings
                    if self._trace is not None:
                        self._trace.first_token()
                else:
                    m.itl.observe(now - self._last)
                self._last = now
                self.completion_tokens += n
            reason = out.finish_reason
            if reason == "error" and out.error_kind in _ELSEWHERE and self._place_again():
                continue
            if reason in ("error", "abort"):
                m.finished("error")
                if self._trace is not None:
                    self._trace.fail(out.error or f"the engine ended the request ({reason})", self.completion_tokens)
                if out.error_kind == ERROR_INVALID and out.error:
                    message, param = refused_field(out.error, self.options)
                    raise EngineFailure(message, 400, param)
                raise EngineFailure(out.error or f"the engine ended the request ({reason})", 503)
            if ids is not None and n:
                ids.extend(out.new_token_ids)
            if token_parser is not None:
                # Every id, the stop token too: harmony reads <|call|> and <|return|>.
                if n:
                    self._add(token_parser.push_tokens(out.new_token_ids), pieces)
                if reason is not None:
                    self._add(token_parser.flush(), pieces)
                    self._keep_calls(token_parser.calls())
                    self._finished(reason, out.stop_reason, out.timings)
                    break
                continue
            if skip_text:
                if reason is not None:
                    self._finished(reason, out.stop_reason, out.timings)
                    break
                continue
            if reason == "stop" and n and drop_stop_token and not isinstance(out.stop_reason, str):
                # The EOS or stop token that ended it is no text unless include_stop_str_in_output, as
                # in vLLM: shown otherwise when skip_special_tokens is false, or when the stop token
                # id is a regular token.
                text = detok.push(out.new_token_ids[:-1]) if n > 1 else ""
            else:
                text = detok.push(out.new_token_ids) if n else ""
            if reason is not None:
                text += detok.flush()
            matched = None
            if stops is not None:
                text, matched = stops.push(text)
                if matched is None and reason is not None:
                    text += stops.flush()
            if parser is None:
                if self._echo is not None and (n or reason is not None):
                    text = self._echoed(text, pieces)
                if text:
                    pieces.append(text)
                    counts.append(self.completion_tokens)
                    if formatter is not None:
                        self.logprobs.append(self._pending)
                        self._pending = []
            else:
                if text:
                    self._add(parser.push(text), pieces)
                if matched is not None or reason is not None:
                    self._add(parser.flush(), pieces)
                    self._keep_calls(parser.calls())
            if matched is not None:
                self._engines.abort(self.stream)
                # Ended here, before the engine's finish: its timings as of the first token, and the
                # decode time between the first and the latest tokens' arrival (both on this clock).
                self._finished("stop", matched, self._timings, self._last - self._first)
                break
            if reason is not None:
                self._finished(reason, out.stop_reason, out.timings)
                break
        return pieces

    def token_entries(self) -> list[Entry]:
        """Token-out (with logprobs): the entries of every id of the latest pieces() call, in order, as
        `token_ids` lists them (text the detokenizer or a stop string holds back does not hold them)."""
        entries = [e for piece in self.logprobs for e in piece] + self._pending + self.tail_logprobs
        self.logprobs, self._pending, self.tail_logprobs = [], [], []
        return entries

    def _keep_calls(self, calls: list[ToolCall]) -> None:
        self.calls = calls if self.options.parallel_tool_calls else calls[:1]

    @property
    def parsing(self) -> bool:
        """A parser runs: the response carries reasoning and tool-call fields."""
        return self._parser is not None or self._token_parser is not None

    def _add(self, parsed: ParsedDelta, pieces: list[Piece]) -> None:
        """A parser's delta as a piece: plain text when it holds nothing but content. With
        parallel_tool_calls false only the first call is kept, as vLLM does."""
        if parsed.tool_calls and not self.options.parallel_tool_calls:
            parsed.tool_calls = [call for call in parsed.tool_calls if call.index == 0]
        if parsed.reasoning or parsed.tool_calls:
            pieces.append(parsed)
        elif parsed.content:
            pieces.append(parsed.content)
        else:
            return
        self.counts.append(self.completion_tokens)
        if self.formatter is not None:
            self.logprobs.append(self._pending)
            self._pending = []

    def _take_logprobs(self, out: RequestOutput, raw_frames: Sequence[bytes], formatter: LogprobsFormatter) -> None:
        """An output's packed logprobs: its tokens' entries wait for the next piece; prompt rows are kept
        (and an echo's entries made before the first token's, which follow them in text_offset)."""
        try:
            if out.packed_prompt_logprobs is not None:
                self.prompt_segments.append(unpack(raw_frames, out.packed_prompt_logprobs))
            if (self._echo_entries is None and self._echo is not None and self.options.logprobs is not None
                    and (out.new_token_ids or out.finish_reason in ("stop", "length"))):
                self._echo_entries = formatter.prompt(self.prompt_segments, self._request.request.prompt_token_ids)
            if out.packed_logprobs is not None and self.options.logprobs is not None:
                self._pending += formatter.sampled(unpack(raw_frames, out.packed_logprobs))
        except ProtocolError as exc:  # an engine's bug: fail this request, not the process
            self._metrics.finished("error")
            raise EngineFailure(f"engine rank {self.stream.rank} sent unreadable logprobs: {exc}") from None

    def _echoed(self, text: str, pieces: list[Piece]) -> str:
        """The first output's text with the echoed prompt before it, as vLLM sends it; when the output
        has no text yet, the echo is a piece of its own (carrying the prompt's entries only)."""
        echo, self._echo = self._echo or "", None
        entries = self._echo_entries or []
        if text:
            self._pending = entries + self._pending
            return echo + text
        if echo:
            pieces.append(echo)
            self.counts.append(self.completion_tokens)
            if self.formatter is not None:
                self.logprobs.append(entries)
        return ""

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        """The usage body with this many completion tokens (the total once finished, or so far)."""
        return usage_body(self.stream.prompt_len, completion_tokens, self.cached_tokens)

    def _finished(self, reason: str, stop_reason: int | str | None, timings: RequestTimings | None,
                  decode_time: float | None = None) -> None:
        self.tail_logprobs, self._pending = self._pending, []
        # As vLLM: a model that stopped after calling tools on its own (tool_choice "auto") finished with
        # "tool_calls"; a forced call finishes "stop". Metrics keep the engine's reason.
        auto = self.calls and reason == "stop" and self.options.tool_choice == "auto"
        self.finish = "tool_calls" if auto else reason
        self.stop_reason = stop_reason
        m = self._metrics
        m.generation_tokens.inc(self.completion_tokens)
        m.request_done(self.stream.prompt_len, self.completion_tokens, self._request.max_tokens, self._parent)
        m.e2e.observe(time.monotonic() - self._start)
        m.finished(reason)
        if self._trace is not None:
            self._trace.finish(self.finish, self.completion_tokens, self.cached_tokens, timings)
        if timings is not None:  # None from engines older than protocol 1.4
            m.request_timings(self.stream.rank, timings, decode_time, generated=self.completion_tokens)

    def _place_again(self) -> bool:
        """A draining rank turned the request away, it could not be sent to its rank, or its rank died
        before it produced anything for it: place it on another rank (not pinned requests: they asked for
        that rank). False when there is none to try."""
        stream = self.stream
        if self.completion_tokens or self._request.request.pinned_rank is not None or stream.gone is not None:
            return False  # tokens were produced, the rank was asked for, or the client left meanwhile
        self._tried.add(stream.engine_index)
        return self._engines.place_again(stream, self._request, self._tried)
