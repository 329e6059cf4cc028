"""A local HTTPS server that answers as Azure's Resource Manager REST API does for the calls
the Azure preflight makes (resource SKUs, usages, a managed cluster), from the responses in
tests/data/azure in the API's documented shape. The Azure SDK's real clients talk to it:
only the host differs."""

from __future__ import annotations

import copy
import json
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from azure.core.credentials import AccessToken

from gpufleet.pki import create_ca, issue_serving_cert

DATA = Path(__file__).parent / "data" / "azure"
SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"


class StaticCredential:
    """A token credential as DefaultAzureCredential is one, with a fixed token."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("recorded-token", int(time.time()) + 3600)


class AzureApi:
    """`answers`: path pattern -> JSON body (copies of the recorded ones, editable by a test);
    `requests`: (path, query) of each call."""

    def __init__(self, folder: Path) -> None:
        self.answers: dict[str, Any] = {
            r"/providers/Microsoft\.Compute/skus$": _load("skus-eastus.json"),
            r"/providers/Microsoft\.Compute/locations/eastus/usages$": _load("usages-eastus.json"),
            r"/resourceGroups/ml-rg/providers/Microsoft\.ContainerService/managedClusters/"
            r"gpufleet$": _load("managed-cluster.json"),
        }
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        ca = create_ca(folder / "ca")
        cert, key = folder / "server.crt", folder / "server.key"
        issue_serving_cert(ca.ca_cert, ca.ca_key, cert, key, ["127.0.0.1", "localhost"])
        self.ca = str(ca.ca_cert)
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                api.requests.append((url.path, parse_qs(url.query)))
                for pattern, body in api.answers.items():
                    if re.search(pattern, url.path):
                        self._answer(200, body)
                        return
                self._answer(404, {"error": {"code": "NotFound", "message": url.path}})

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def options(self) -> dict[str, str]:
        """The Azure clients' options that point them here."""
        return {"base_url": self.url, "connection_verify": self.ca}

    def close(self) -> None:
        self.server.shutdown()


def _load(name: str) -> Any:
    return copy.deepcopy(json.loads((DATA / name).read_text()))
