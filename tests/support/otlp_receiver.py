"""An OTLP/HTTP traces receiver for tests and benches: POST /v1/traces with an ExportTraceServiceRequest
protobuf (what every service's http/protobuf exporter sends), each span kept with its service, ids and
attributes; `wait_for` waits for them (woken by each export) until a deadline. In a test's process, or
as a process of its own (`python -m tests.support.otlp_receiver --port P`, GET /stats: its counts)."""
from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root
    kind: int
    attributes: dict[str, Any] = field(hash=False)
    start_ns: int = 0
    end_ns: int = 0
    status_code: int = 0  # 2: error


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    def __init__(self, port: int = 0) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver._take(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def do_GET(self) -> None:
                spans = receiver.snapshot()
                body = json.dumps({"spans": len(spans), "exports": receiver.requests,
                                   "router_requests": sum(1 for s in spans if s.name == "router.request"),
                                   "services": sorted({s.service for s in spans})}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    got.append(ReceivedSpan(str(resource.get("service.name", "")), s.name, s.trace_id.hex(),
                                            s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                                            {a.key: _value(a.value) for a in s.attributes},
                                            s.start_time_unix_nano, s.end_time_unix_nano, s.status.code))
        with self._lock:
            self.spans.extend(got)
            self.requests += 1
            self._lock.notify_all()

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 20.0) -> list[ReceivedSpan]:
        """The spans received once `done` holds for them; AssertionError past the deadline, with what came."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not done(list(self.spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted((s.service, s.name) for s in self.spans)
                    raise AssertionError(f"spans not received within {timeout_s}s; got {names}")
                self._lock.wait(left)  # woken by each export that arrives
            return list(self.spans)


def main() -> None:
    ap = argparse.ArgumentParser(description="an OTLP/HTTP traces receiver (POST /v1/traces, GET /stats)")
    ap.add_argument("--port", type=int, required=True)
    receiver = OtlpReceiver(ap.parse_args().port)
    receiver._server.serve_forever()


if __name__ == "__main__":
    main()
