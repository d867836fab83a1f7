"""Output processing: the only code that loops over a request's engine outputs (detokenize, stop
strings, finish, usage, metrics, a request that a draining or unreachable rank did not take placed
again). Runs on each API server's event loop, one OutputProcessor per request, in one pass over each
batch of queued outputs.

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
from typing import Any, Protocol

from tokenizers import Tokenizer

from protocol import ERROR_DRAINING, ERROR_INVALID
from services.frontend import responses
from services.frontend.detokenizer import IncrementalDetokenizer
from services.frontend.metrics import Metrics
from services.frontend.parsers import OutputParser, ParsedDelta, TokenOutputParser, ToolCall
from services.frontend.stop_strings import StopChecker
from services.frontend.stream import CLIENT_GONE, NOT_SENT, EngineFailure, Stream
from services.frontend.translation import EngineRequest, OutputOptions, refused_field


class EnginePort(Protocol):
    """What output processing may ask of the engines serving its request."""

    def abort(self, stream: Stream) -> None:
        """Stop the request at its engine (a stop string matched)."""

    def place_again(self, stream: Stream, request: EngineRequest, exclude: set[int]) -> bool:
        """Send it to an engine whose index is not in `exclude`; False when none can take it."""


Piece = str | ParsedDelta  # content text, or a parser's delta with reasoning or tool calls
# Refusals that prove the rank never started the request: another rank may serve it.
_ELSEWHERE = (ERROR_DRAINING, NOT_SENT)


class OutputProcessor:
    """One request's engine outputs turned into text pieces, with its counts, timings and metrics.

    Call pieces() until `finish` is set. It records the request's metrics when it ends, also when it
    fails (EngineFailure), so the writers only write."""

    __slots__ = ("_detok", "_engines", "_last", "_metrics", "_parser", "_request", "_start", "_stops",
                 "_token_parser", "_tried", "cached_tokens", "calls", "completion_tokens", "counts", "finish",
                 "options", "stop_reason", "stream", "token_ids")

    def __init__(self, stream: Stream, request: EngineRequest, *, tokenizer: Tokenizer, engines: EnginePort,
                 metrics: Metrics, parser: OutputParser | TokenOutputParser | None = None) -> None:
        self.stream, self._request, self._engines, self._metrics = stream, request, engines, metrics
        self.options: OutputOptions = request.output
        self._detok = IncrementalDetokenizer(tokenizer, request.request.prompt_token_ids,
                                             skip_special_tokens=self.options.skip_special_tokens)
        stops = self.options.stop
        self._stops = (StopChecker(stops, include_stop_str_in_output=self.options.include_stop_str_in_output)
                       if stops else None)
        self._parser: OutputParser | None = None
        self._token_parser: TokenOutputParser | None = None
        if isinstance(parser, TokenOutputParser):
            self._token_parser = parser
        else:
            self._parser = parser
        self.calls: list[ToolCall] = []  # the tool calls the parser found, once finished
        self._tried: set[int] = set()  # engine indexes that refused it while draining
        self._start = time.monotonic()
        self._last = 0.0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish: str | None = None
        self.stop_reason: int | str | None = None
        self.counts: list[int] = []  # completion tokens so far at each of the latest pieces
        # Token-out requests (options.token_out): the ids of the latest pieces() call, every id the engine
        # produced (the EOS or stop token too, as vLLM's token_ids), up to the one that matched a stop string.
        self.token_ids: list[int] = []

    async def pieces(self) -> list[Piece]:
        """Text of everything the engine produced since the last call; sets `finish` when done.
        Raises EngineFailure when the engine failed or refused the request, or the client left."""
        m = self._metrics
        try:
            outs = await self.stream.next()
        except EngineFailure:
            # As vLLM: a client that left aborted its request; the tokens made before still count.
            m.generation_tokens.inc(self.completion_tokens)
            m.request_done(self.stream.prompt_len, self.completion_tokens, self._request.max_tokens)
            m.finished("abort" if self.stream.gone == CLIENT_GONE else "error")
            raise
        now = time.monotonic()
        detok, stops, parser, token_parser = self._detok, self._stops, self._parser, self._token_parser
        drop_stop_token = not self.options.include_stop_str_in_output
        pieces: list[Piece] = []
        counts = self.counts = []
        ids: list[int] | None = None
        if self.options.token_out:
            ids = self.token_ids = []
        for out in outs:
            n = len(out.new_token_ids)
            if n:
                if self.completion_tokens == 0:
                    m.ttft.observe(now - self._start)
                    self.cached_tokens = out.num_cached_tokens
                else:
                    m.itl.observe(now - self._last)
                    m.tpot.observe(now - self._last)
                self._last = now
                self.completion_tokens += n
            reason = out.finish_reason
            if reason == "error" and out.error_kind in _ELSEWHERE and self._place_again():
                continue
            if reason in ("error", "abort"):
                m.finished("error")
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
                    self._finished(reason, out.stop_reason)
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
                if text:
                    pieces.append(text)
                    counts.append(self.completion_tokens)
            else:
                if text:
                    self._add(parser.push(text), pieces)
                if matched is not None or reason is not None:
                    self._add(parser.flush(), pieces)
                    self._keep_calls(parser.calls())
            if matched is not None:
                self._engines.abort(self.stream)
                self._finished("stop", matched)
                break
            if reason is not None:
                self._finished(reason, out.stop_reason)
                break
        return pieces

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

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        """The usage body with this many completion tokens (the total once finished, or so far)."""
        return responses.usage(self.stream.prompt_len, completion_tokens, self.cached_tokens)

    def _finished(self, reason: str, stop_reason: int | str | None) -> None:
        # As vLLM: a model that stopped after calling tools on its own (tool_choice "auto") finished with
        # "tool_calls"; a forced call finishes "stop". Metrics keep the engine's reason.
        auto = self.calls and reason == "stop" and self.options.tool_choice == "auto"
        self.finish = "tool_calls" if auto else reason
        self.stop_reason = stop_reason
        m = self._metrics
        m.generation_tokens.inc(self.completion_tokens)
        m.request_done(self.stream.prompt_len, self.completion_tokens, self._request.max_tokens)
        m.e2e.observe(time.monotonic() - self._start)
        m.finished(reason)

    def _place_again(self) -> bool:
        """A draining rank turned the request away, or it could not be sent to its rank: place it on
        another rank (not pinned requests: they asked for that rank). False when there is none to try."""
        stream = self.stream
        if self.completion_tokens or self._request.request.pinned_rank is not None or stream.gone is not None:
            return False  # tokens were produced, the rank was asked for, or the client left meanwhile
        self._tried.add(stream.engine_index)
        return self._engines.place_again(stream, self._request, self._tried)
