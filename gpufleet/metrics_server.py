"""`/metrics` for Prometheus and `/healthz` for a liveness probe, on one port: what the
controller and the node agent both serve."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve(
    port: int,
    addr: str,
    healthy: Callable[[], str | None] | None,
    registry: CollectorRegistry,
) -> ThreadingHTTPServer:
    """Serve `registry` in a daemon thread. `healthy()` returns None when all is well, else
    why not (answered with 503, so the kubelet restarts the container)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/healthz":
                problem = healthy() if healthy is not None else None
                body = (problem or "ok").encode() + b"\n"
                self.send_response(503 if problem else 200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
            else:
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would flood the log

    server = ThreadingHTTPServer((addr, port), Handler)
    threading.Thread(target=server.serve_forever, name="gpufleet-metrics", daemon=True).start()
    return server
