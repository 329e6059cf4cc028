"""`/metrics` for Prometheus and `/healthz` for a liveness probe, on one port: what the
controller and the node agent both serve."""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class PortInUse(Exception):
    """Another process listens on the port asked for (a second agent or controller)."""


def in_use(addr: str, port: int) -> PortInUse:
    return PortInUse(f"port {port} on {addr} is already in use (by another gpufleet agent or "
                     "controller on this machine?)")  # fmt: skip


def check_free(addr: str, port: int) -> None:
    """Raise PortInUse when another process listens on `port` (checked before a server that
    would fail deep inside its start, e.g. the controller's, is started)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((addr, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise in_use(addr, port) from None
            # anything else (a name to resolve, an address not here) is the server's to report


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

    try:
        server = ThreadingHTTPServer((addr, port), Handler)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise in_use(addr, port) from None
        raise
    threading.Thread(target=server.serve_forever, name="gpufleet-metrics", daemon=True).start()
    return server
