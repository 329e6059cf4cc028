"""Local receivers for notification tests: real HTTP, for Slack and webhook messages."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """A local HTTP endpoint that records what it is sent; `fail_first` answers 500 first;
    `answer`: the body of every 200 (Slack's Web API answers JSON)."""

    def __init__(self, fail_first: int = 0, answer: bytes = b"ok") -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.fail_first = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.fail_first > 0:
                    receiver.fail_first -= 1
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(b"busy")
                    return
                receiver.received.append((dict(self.headers), body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def json(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.received]
