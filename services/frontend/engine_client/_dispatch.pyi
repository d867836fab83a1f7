"""Types of the C extension _dispatch.c (built by setup.py where a compiler is; see engines.py's import)."""
from collections.abc import Sequence

from protocol import RequestOutput
from services.frontend.engine_client.inflight import InFlight

def dispatch(outputs: list[RequestOutput], inflight: dict[str, InFlight], raw_frames: Sequence[bytes], now: float,
             /) -> list[tuple[InFlight, RequestOutput]] | None: ...
