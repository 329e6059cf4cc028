"""What every request passes before a route sees it: security headers on every answer, a rate
limit per client, the write header (`WRITE_HEADER`) on every write, and, for `--insecure-local`
(no token asked), a Host and Origin check so that no other site's page can reach the server
through the browser of someone on this machine (cross-site requests, DNS rebinding)."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from gpufleet.api.access import token_digest
from gpufleet.api.limits import Limits
from gpufleet.model.keys import WRITE_HEADER

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # the dashboard is one self-contained page: its script and style are inline, it loads
    # nothing from elsewhere and talks only to this server
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'",
    "Cache-Control": "no-store",
}
HSTS = ("Strict-Transport-Security", "max-age=31536000")


class Buckets:
    """A token bucket per client key, for a rate and a burst; bounded in the clients it
    remembers."""

    def __init__(self, rate: float, burst: float, tracked: int,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.rate, self.burst, self.tracked, self.clock = rate, burst, tracked, clock
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.lock = threading.Lock()

    def take(self, key: str, cost: float = 1.0) -> float:
        """0 when `key` may go on (and charge it), else the seconds until it may."""
        now = self.clock()
        with self.lock:
            tokens, at = self.buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            wait = 0.0 if tokens >= cost else (cost - tokens) / self.rate
            self.buckets[key] = (tokens - cost if wait == 0 else tokens, now)
            while len(self.buckets) > self.tracked:
                self.buckets.popitem(last=False)
            return wait

    def exhausted(self, key: str, cost: float = 1.0) -> float:
        """The seconds until `key` could take `cost`, charging nothing."""
        now = self.clock()
        with self.lock:
            tokens, at = self.buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        return 0.0 if tokens >= cost else (cost - tokens) / self.rate


def client_key(request: Request) -> str:
    """The client's address (behind an ingress, the ingress's: see `rate_key`)."""
    return request.client.host if request.client else "unknown"


def rate_key(request: Request) -> str:
    """Whom a request's rate is counted against: its bearer token (a digest of it) where it
    has one, so that callers behind one ingress or NAT are limited one by one; else its
    address."""
    token = request.headers.get("authorization")
    if token:
        return "token:" + token_digest(token)
    return "address:" + client_key(request)


def too_many(wait: float, what: str) -> tuple[str, dict[str, str]]:
    """The 429's words and its Retry-After header, for a client that must wait `wait` s."""
    seconds = max(1, math.ceil(wait))
    return f"too many {what} from this client: retry in {seconds} s", {"Retry-After": str(seconds)}


def _host_name(value: str) -> str:
    """The host of a Host header or an Origin, without port or brackets."""
    netloc = urlsplit(value).netloc if "://" in value else value
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")]
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def local_refusal(request: Request) -> str | None:
    """Why an `--insecure-local` server refuses a request, or None. The server listens on
    loopback, but a page of any site can make this machine's browser send it requests: to a
    name that resolves to 127.0.0.1 (DNS rebinding: its Host is that name) or from its own
    origin (its Origin says so)."""
    host = _host_name(request.headers.get("host", ""))
    if host not in LOOPBACK_HOSTS:
        return (
            f"Host {host or '(none)'} refused: an --insecure-local server answers only "
            "requests to localhost, 127.0.0.1 or [::1]"
        )
    origin = request.headers.get("origin")
    if origin is not None and _host_name(origin) not in LOOPBACK_HOSTS:
        return f"Origin {origin} refused: an --insecure-local server answers no other site's pages"
    return None


def install(app: FastAPI, limits: Limits, local: bool, tls: bool) -> None:
    """Add the checks to `app` (a middleware that runs before every route)."""
    requests = Buckets(limits.rate, limits.burst, limits.tracked_clients)
    app.state.failed_tokens = Buckets(
        limits.failed_tokens_per_minute / 60,
        limits.failed_tokens_per_minute,
        limits.tracked_clients,
    )
    headers = dict(SECURITY_HEADERS)
    if tls:
        headers[HSTS[0]] = HSTS[1]

    @app.middleware("http")
    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await _checked(request, call_next)
        response.headers.update(headers)
        return response

    async def _checked(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path == "/healthz":
            return await call_next(request)  # probes: never limited
        if local:
            refusal = local_refusal(request)
            if refusal is not None:
                return JSONResponse({"detail": refusal}, status_code=403)
        if request.method in WRITES and not request.headers.get(WRITE_HEADER):
            return JSONResponse(
                {"detail": f"a write needs the header {WRITE_HEADER} (any value): the SDK, the "
                 "CLI and the dashboard send it; a page of another site cannot"},
                status_code=403,
            )  # fmt: skip
        wait = requests.take(rate_key(request))
        if wait > 0:
            said, retry = too_many(wait, "requests")
            return JSONResponse({"detail": said}, status_code=429, headers=retry)
        return await call_next(request)
