"""The standalone agent's OpenTelemetry receiver: OTLP metrics over gRPC (4317) and HTTP
(4318, protobuf or JSON, gzip or not), put on a bounded queue that one worker drains into the
`MetricStore` the agent's /metrics serves. A full queue drops its oldest request and counts it:
a program that floods the agent slows nothing else and never grows its memory."""

from __future__ import annotations

import gzip
import logging
import os
import threading
import time
from collections import deque
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as service
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as service_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpufleet.otlp.store import MetricStore

log = logging.getLogger("gpufleet.agent.otlp")
QUEUE_ENV = "GPUFLEET_OTLP_METRICS_QUEUE_SIZE"
DEFAULT_QUEUE = 1_000  # export requests (an SDK sends one per interval, every metric in it)
MAX_BODY = 16 * 2**20  # one request, decompressed


def queue_size() -> int:
    """$GPUFLEET_OTLP_METRICS_QUEUE_SIZE, else the default; ValueError naming a bad value."""
    given = os.environ.get(QUEUE_ENV, "")
    if not given:
        return DEFAULT_QUEUE
    if not given.isdigit() or int(given) < 1:
        raise ValueError(f"{QUEUE_ENV}={given!r}: give a whole number of requests, 1 or more")
    return int(given)


def _points(request: Any) -> int:
    return sum(
        len(getattr(m, m.WhichOneof("data")).data_points) if m.WhichOneof("data") else 0
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )


class Ingest:
    """The bounded queue and its worker."""

    def __init__(self, store: MetricStore, size: int, registry: CollectorRegistry) -> None:
        self.store = store
        self.queue: deque[Any] = deque()
        self.size = size
        self.ready = threading.Condition()
        self.stop = threading.Event()
        self.dropped = Counter(
            "gpufleet_otlp_dropped", "OTLP export requests and their data points dropped by "
            "a full queue (the oldest go first).", ["what"], registry=registry,
        )  # fmt: skip
        self.depth = Gauge("gpufleet_otlp_queue_depth", "OTLP export requests waiting.",
                           registry=registry)  # fmt: skip
        self.depth.set_function(lambda: len(self.queue))
        self.worker = threading.Thread(target=self._drain, name="gpufleet-otlp", daemon=True)

    def start(self) -> None:
        self.worker.start()

    def put(self, request: Any) -> None:
        with self.ready:
            if len(self.queue) >= self.size:
                oldest = self.queue.popleft()
                self.dropped.labels("requests").inc()
                self.dropped.labels("data_points").inc(_points(oldest))
            self.queue.append(request)
            self.ready.notify()

    def _drain(self) -> None:
        while not self.stop.is_set():
            with self.ready:
                while not self.queue and not self.stop.is_set():
                    self.ready.wait(1.0)
                if self.stop.is_set():
                    return
                request = self.queue.popleft()
            try:
                self.store.apply(request, time.monotonic())
            except Exception:  # a malformed request costs itself only
                log.exception("an OTLP request could not be stored")

    def close(self) -> None:
        self.stop.set()
        with self.ready:
            self.ready.notify_all()


class _Metrics(service_grpc.MetricsServiceServicer):
    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    def Export(self, request: Any, context: Any) -> Any:
        self.ingest.put(request)
        return service.ExportMetricsServiceResponse()


def _http_handler(ingest: Ingest) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.split("?")[0] != "/v1/metrics":
                self._answer(404, "text/plain", b"OTLP/HTTP: POST /v1/metrics\n")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._answer(413, "text/plain", b"request too large\n")
                return
            body = self.rfile.read(length)
            kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            try:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = service.ExportMetricsServiceRequest()
                if kind == "application/json":
                    json_format.Parse(body, request)
                else:
                    request.ParseFromString(body)
            except (OSError, DecodeError, json_format.ParseError, UnicodeDecodeError) as err:
                self._answer(400, "text/plain", f"not an OTLP metrics request: {err}\n".encode())
                return
            ingest.put(request)
            answer = service.ExportMetricsServiceResponse()
            if kind == "application/json":
                self._answer(200, "application/json", json_format.MessageToJson(answer).encode())
            else:
                self._answer(200, "application/x-protobuf", answer.SerializeToString())

        def _answer(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a line per export would flood the journal

    return Handler


class OtlpReceiver:
    """OTLP/gRPC on `grpc_port` and OTLP/HTTP on `http_port` (0: not served), on `host`."""

    def __init__(
        self, ingest: Ingest, host: str, grpc_port: int, http_port: int, workers: int = 4
    ) -> None:
        self.ingest = ingest
        self.grpc: Any = None
        self.http: ThreadingHTTPServer | None = None
        if grpc_port:
            self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
            service_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
                _Metrics(ingest), self.grpc
            )
            if not self.grpc.add_insecure_port(f"{host}:{grpc_port}"):
                raise OSError(f"cannot listen on {host}:{grpc_port} for OTLP/gRPC")
        if http_port:
            self.http = ThreadingHTTPServer((host, http_port), _http_handler(ingest))

    def start(self) -> None:
        self.ingest.start()
        if self.grpc is not None:
            self.grpc.start()
        if self.http is not None:
            threading.Thread(
                target=self.http.serve_forever, name="gpufleet-otlp-http", daemon=True
            ).start()

    def close(self) -> None:
        if self.grpc is not None:
            self.grpc.stop(grace=2).wait(5)
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        self.ingest.close()
