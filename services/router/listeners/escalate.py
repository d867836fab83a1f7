"""The escalate algorithm run for one call (router process): stages called in order, each answer judged
whole (decision/algorithms.py's `verdict`), and the first accepted one (or the last one got within the
deadline and call cap) sent to the client, replayed as a stream (codecs/openai.py's `as_chunks`) for a
client that asked for one. A stage is called without streaming: its answer is judged whole before the
client sees any of it. When no stage was accepted, the algorithm's judge (an LLM in a chat pool) may
pick one of the complete answers received, within what is left of the deadline; abstaining, it leaves
the last one."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import Send

from services.router.backends.dispatch import Dispatcher, Opened
from services.router.backends.upstream import READ_ERRORS, UpstreamError, decode_object
from services.router.config import EscalateAlgorithm
from services.router.decision import judge as judging
from services.router.decision.algorithms import answer_text, verdict
from services.router.decision.judge import JudgeCaller
from services.router.errors import HTTPError
from services.router.listeners.call import Call
from services.router.listeners.judge_caller import PoolJudge
from services.router.listeners.relay import Relay
from services.router.metrics import RouterMetrics

log = logging.getLogger("router")


Answer = tuple[str, Opened, dict[str, Any], str | None]  # stage, its response, completion, why not accepted


class Escalator:
    def __init__(self, dispatcher: Dispatcher, relay: Relay, metrics: RouterMetrics,
                 judge: JudgeCaller | None = None) -> None:
        """`judge`: how a judge pool is asked; by default over `dispatcher`, as the stages are."""
        self.dispatcher = dispatcher
        self.relay = relay
        self.metrics = metrics
        self.judge: JudgeCaller = judge if judge is not None else PoolJudge(dispatcher)

    async def escalate(self, call: Call, algorithm: EscalateAlgorithm, send: Send) -> None:
        """Stages in order until one is accepted; the client is told which stage answered."""
        # The loop's clock, the one its timers fire by (uvloop's lags time.monotonic() a little).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + algorithm.deadline_s
        calls, refusal = 0, None
        answers: list[Answer] = []  # the complete (HTTP 200) ones, in stage order
        payloads: dict[str, bytes] = {}
        for stage in algorithm.stages:
            if calls >= algorithm.max_calls or loop.time() >= deadline:
                break
            calls += 1
            opened: Opened | None = None
            outcome: bool | None = None  # for the replica's breaker: a passed deadline says nothing
            shared = asyncio.timeout_at(deadline)
            try:
                async with shared:
                    # The shared deadline is this timeout's: a shorter one inside would fail the stage
                    # a moment early and leave a sliver of time for the next stage to be called in.
                    # A stage queues as its request does (its class, its tenant), within the deadline.
                    opened = await self.dispatcher.open_any(call.chat, call.choice.text, call.codec.upstream_path,
                                                            (stage,), payloads, stream=False, bulk=call.bulk,
                                                            ticket=call.ticket)
                    raw = await opened.response.read()
                status = opened.response.status
                completion = decode_object(raw) if status == 200 else {}
                outcome = True
            except HTTPError as exc:
                refusal = exc
                log.info("escalate %s: stage %s refused: %s", call.choice.entry.name, stage, exc.message)
                continue
            except (*READ_ERRORS, UpstreamError) as exc:
                if shared.expired():  # the shared deadline, not the replica (its own read timeout is a failure)
                    refusal = HTTPError(504, f"stage {stage!r}: no answer within the {algorithm.deadline_s}s deadline")
                    continue
                outcome = False
                self.metrics.upstream_errors.labels(stage).inc()
                log.warning("escalate %s: stage %s failed: %s", call.choice.entry.name, stage, exc)
                refusal = HTTPError(502, f"stage {stage!r}: {exc}")
                continue
            finally:
                if opened is not None:
                    opened.response.close()
                    opened.lease.release(outcome)
            if status != 200:
                refusal = HTTPError(status if status < 500 else 502, f"stage {stage!r} answered HTTP {status}: "
                                    f"{raw[:300].decode(errors='replace')}")
                continue
            why = verdict(algorithm.accept, completion)
            answers.append((stage, opened, completion, why))
            if why is None:
                break
            self.metrics.escalations.labels(call.choice.entry.name, stage).inc()
            log.info("escalate %s: stage %s not accepted: %s", call.choice.entry.name, stage, why)
        if not answers:
            raise refusal or HTTPError(504, f"no stage answered within {algorithm.deadline_s}s")
        answer, judged = answers[-1], None
        if answer[3] is not None and algorithm.judge is not None and loop.time() < deadline:
            answer, judged = await self._judged(call, algorithm, answers, deadline)
        stage, opened, completion, why = answer
        if judged is not None:
            call.headers.append((b"x-router-judge", judged.encode()))
        call.headers += [(b"x-router-pool", stage.encode()),
                         (b"x-router-replica", opened.lease.replica.url.encode()),
                         (b"x-router-attempts", str(opened.attempts).encode()),
                         (b"x-router-stage", stage.encode()), (b"x-router-calls", str(calls).encode()),
                         (b"x-router-accepted", b"true" if why is None else b"false")]
        call.escalation = {"stage": stage, "calls": calls, "accepted": why is None, "reason": why}
        if judged is not None:
            call.escalation["judge"] = judged
        try:
            await self.relay.send_whole(call, completion, send)
        except UpstreamError as exc:  # the answer's shape is not a completion's: the replica's fault
            raise HTTPError(502, f"stage {stage!r}: {exc}") from None

    async def _judged(self, call: Call, algorithm: EscalateAlgorithm, answers: list[Answer],
                      deadline: float) -> tuple[Answer, str]:
        """The answer the judge chose and "chose", or the last one and "abstained" (it abstained, replied
        anything but an option's number, failed, or ran past its timeout or the deadline)."""
        assert algorithm.judge is not None  # asked only when the algorithm has one
        pool = algorithm.judge.pool
        timeout_s = min(algorithm.judge.timeout_s, deadline - asyncio.get_running_loop().time())
        # The conversation's end is what was asked last: that is the part kept of a long one.
        asked = judging.cut(call.choice.text, judging.INPUT_CHARS, tail=True)
        options = [(stage, judging.chat_option(answer_text(completion)[0])) for stage, _, completion, _ in answers]
        try:
            async with asyncio.timeout(timeout_s):
                reply = await self.judge.ask(pool, judging.prompt("chat", asked, options), timeout_s=timeout_s)
        except TimeoutError:
            log.info("escalate %s: judge %s gave no reply within %.3g s", call.choice.entry.name, pool, timeout_s)
            return answers[-1], "abstained"
        except Exception as exc:  # whatever the judge's pool did, the client keeps the stages' answer
            log.warning("escalate %s: judge %s failed: %s: %s", call.choice.entry.name, pool, type(exc).__name__, exc)
            return answers[-1], "abstained"
        chosen = judging.read(reply, len(answers))
        if chosen is None:
            log.info("escalate %s: judge %s abstained: %r", call.choice.entry.name, pool, judging.cut(reply, 100))
            return answers[-1], "abstained"
        return answers[chosen], "chose"
