"""The standalone agent's upload to `gpufleet server`: every poll its /metrics text becomes a
numbered report in an on-disk buffer, and a sender posts the oldest ones, removing each only
once the server has taken it. While the server is away reports wait on disk (bounded: past the
bound the oldest are dropped and counted); a batch whose answer was lost is sent again and the
server, which keeps each agent's last sequence, takes none twice.

Plain `urllib` and `gzip`, no HTTP library: the agent must stay small (issue 48: 100 MiB)."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import ssl
import threading
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from gpufleet.model.keys import WRITE_HEADER

log = logging.getLogger("gpufleet.agent")
BUFFER_ENV = "GPUFLEET_AGENT_BUFFER_REPORTS"
DEFAULT_BUFFER_REPORTS = 8640  # 12 hours at the default 5 s poll; some 10 KiB each on disk
BATCH = 20  # reports per request: a catch-up after an outage takes few round trips
BACKOFF_S = (1.0, 60.0)
TIMEOUT_S = 30.0
REPORTS_PATH = "/api/v1/hosts/{name}/reports"


def buffer_size() -> int:
    """`$GPUFLEET_AGENT_BUFFER_REPORTS`, or the default; ValueError naming it when bad."""
    raw = os.environ.get(BUFFER_ENV, "").strip()
    if not raw:
        return DEFAULT_BUFFER_REPORTS
    try:
        size = int(raw)
    except ValueError:
        raise ValueError(f"{BUFFER_ENV}={raw!r} is not a whole number of reports") from None
    if size < 1:
        raise ValueError(f"{BUFFER_ENV}={raw!r}: give at least 1")
    return size


class BufferUnusable(Exception):
    """The buffer folder cannot be used (not writable, not a folder)."""


class ReportBuffer:
    """Numbered reports in a folder: `NNNNNNNNNNNN.json.gz`, with the buffer's id (`agent-id`)
    and the last number given (`sequence`) beside them, so that numbers go on across restarts
    and the server can tell a resent report from a new one."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder, self.limit = folder, limit
        self.lock = threading.Lock()
        self.dropped = 0
        try:
            (folder / "reports").mkdir(parents=True, exist_ok=True)
            id_file = folder / "agent-id"
            if not id_file.exists():
                _write(id_file, uuid.uuid4().hex)
            self.agent_id = id_file.read_text().strip()
            waiting = sorted(
                int(p.name.split(".")[0])
                for p in (folder / "reports").glob("*.json.gz")
                if p.name.split(".")[0].isdigit()
            )
            sequence_file = folder / "sequence"
            recorded = int(sequence_file.read_text()) if sequence_file.exists() else 0
        except (OSError, ValueError) as err:
            raise BufferUnusable(f"report buffer {folder}: {err}") from None
        self.waiting: deque[int] = deque(waiting)
        self.sequence = max([recorded, *waiting])

    def _path(self, sequence: int) -> Path:
        return self.folder / "reports" / f"{sequence:012d}.json.gz"

    def put(self, taken: datetime, interval_s: float, metrics: str) -> int:
        """Keep one report; its number. Past the limit the oldest go (counted in `dropped`)."""
        with self.lock:
            sequence = self.sequence + 1
            body = {"sequence": sequence, "time": taken.isoformat(), "interval": interval_s,
                    "metrics": metrics}  # fmt: skip
            temporary = self._path(sequence).with_suffix(".tmp")
            temporary.write_bytes(gzip.compress(json.dumps(body).encode(), compresslevel=5))
            temporary.replace(self._path(sequence))
            _write(self.folder / "sequence", str(sequence))
            self.sequence = sequence
            self.waiting.append(sequence)
            while len(self.waiting) > self.limit:
                self._remove(self.waiting.popleft())
                self.dropped += 1
            return sequence

    def oldest(self, count: int) -> list[dict[str, Any]]:
        """Up to `count` of the oldest reports (a report unreadable on disk is dropped)."""
        with self.lock:
            numbers = list(self.waiting)[:count]
        out = []
        for sequence in numbers:
            try:
                out.append(json.loads(gzip.decompress(self._path(sequence).read_bytes())))
            except (OSError, ValueError, EOFError) as err:
                log.error("report %d of the buffer cannot be read (%s): dropped", sequence, err)
                self.remove([sequence])
                with self.lock:
                    self.dropped += 1
        return out

    def remove(self, sequences: list[int]) -> None:
        gone = set(sequences)
        with self.lock:
            self.waiting = deque(s for s in self.waiting if s not in gone)
            for sequence in gone:
                self._remove(sequence)

    def _remove(self, sequence: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(sequence).unlink()

    def __len__(self) -> int:
        return len(self.waiting)


def _write(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer (the server unreachable)
    message: str


class Server:
    """Where reports go: `POST {url}/api/v1/hosts/{host}/reports` with the host's token."""

    def __init__(
        self, url: str, host: str, token: Callable[[], str], ca_cert: str | None = None
    ) -> None:
        self.url = url.rstrip("/") + REPORTS_PATH.format(name=host)
        self.token = token  # read at each request: a token replaced in its file is used at once
        self.context = ssl.create_default_context(cafile=ca_cert) if ca_cert else None

    def post(self, body: dict[str, Any]) -> Answer:
        try:
            token = self.token()
        except OSError as err:
            return Answer(401, f"the host's token cannot be read: {err}")
        request = urllib.request.Request(
            self.url,
            data=gzip.compress(json.dumps(body).encode(), compresslevel=5),
            method="POST",
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
                WRITE_HEADER: "agent",  # the server's guard against writes from web pages
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.context) as r:
                return Answer(r.status, r.read().decode(errors="replace"))
        except urllib.error.HTTPError as err:
            return Answer(err.code, err.read().decode(errors="replace")[:500])
        except (OSError, ValueError) as err:  # refused, timed out, TLS, bad URL
            return Answer(0, str(getattr(err, "reason", err)))


class UploadMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.reports = Counter(
            "gpufleet_agent_reports_total",
            "Reports of this host, by outcome: made (one per poll), sent (taken by the server), "
            "dropped (the buffer full, or unreadable), rejected (refused by the server as bad).",
            ["outcome"],
            registry=registry,
        )
        self.buffered = Gauge(
            "gpufleet_agent_reports_buffered",
            "Reports on disk waiting for the server.",
            registry=registry,
        )
        for outcome in ("made", "sent", "dropped", "rejected"):
            self.reports.labels(outcome)


class Uploader:
    """Two loops: one makes a report every `interval_s`, one sends the buffer's oldest."""

    def __init__(
        self,
        buffer: ReportBuffer,
        server: Server,
        registry: CollectorRegistry,
        interval_s: float,
        version: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        follow: Callable[[str | None], None] | None = None,
    ) -> None:
        self.buffer, self.server, self.registry = buffer, server, registry
        self.follow = follow  # what the server says of the host's drain (`slurm.SlurmDrain`)
        self.interval_s, self.version, self.clock = interval_s, version, clock
        self.metrics = UploadMetrics(registry)
        self.wake = threading.Event()
        self.reachable: bool | None = None  # as last logged: a change is logged once
        self.dropped_seen = buffer.dropped

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._make, args=(stop,), name="gpufleet-report", daemon=True),
            threading.Thread(target=self._send, args=(stop,), name="gpufleet-upload", daemon=True),
        ]
        for thread in threads:
            thread.start()
        return threads

    def make_one(self) -> int:
        metrics = generate_latest(self.registry).decode()
        sequence = self.buffer.put(self.clock(), self.interval_s, metrics)
        self.metrics.reports.labels("made").inc()
        self._count_drops()
        return sequence

    def _count_drops(self) -> None:
        dropped = self.buffer.dropped - self.dropped_seen
        if dropped:
            self.dropped_seen = self.buffer.dropped
            self.metrics.reports.labels("dropped").inc(dropped)
            log.warning("report buffer full (%d): %d oldest dropped", self.buffer.limit, dropped)
        self.metrics.buffered.set(len(self.buffer))

    def _make(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            try:
                self.make_one()
            except OSError as err:  # a full disk must not end the agent: its metrics go on
                log.error("report not kept in %s: %s", self.buffer.folder, err)
            self.wake.set()

    def _send(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            if not self.send_once():
                failures += 1
                first, longest = BACKOFF_S
                stop.wait(min(longest, first * 2 ** (failures - 1)))
                continue
            failures = 0
            if len(self.buffer) == 0:
                self.wake.wait(self.interval_s)
                self.wake.clear()

    def send_once(self) -> bool:
        """Send the oldest batch; False when the server did not take it (try again later)."""
        batch = self.buffer.oldest(BATCH)
        self._count_drops()
        if not batch:
            return True
        answer = self.server.post(
            {"agent": self.buffer.agent_id, "agentVersion": self.version, "reports": batch}
        )
        sequences = [int(r["sequence"]) for r in batch]
        if 200 <= answer.status < 300:
            self.buffer.remove(sequences)
            self.metrics.reports.labels("sent").inc(len(batch))
            self.metrics.buffered.set(len(self.buffer))
            self._reachable(True, "")
            if self.follow is not None:
                self.follow(_drain_of(answer.message))
            return True
        if answer.status in (400, 413, 422):  # never taken as sent: dropped, and said why
            log.error("the server refused reports %d-%d as bad (%d %s): dropped",
                      sequences[0], sequences[-1], answer.status, answer.message)  # fmt: skip
            self.buffer.remove(sequences)
            self.metrics.reports.labels("rejected").inc(len(batch))
            return True
        self._reachable(False, _why(answer, self.server.url))
        return False

    def _reachable(self, now: bool, why: str) -> None:
        if now != self.reachable:
            self.reachable = now
            if now:
                log.info("server %s takes reports", self.server.url)
            else:
                log.warning("reports wait on disk (%d): %s", len(self.buffer), why)


def _why(answer: Answer, url: str) -> str:
    if answer.status == 0:
        return f"{url} does not answer ({answer.message})"
    if answer.status in (401, 403):
        return (f"{url} refused the host's token ({answer.status}: {answer.message}); make one "
                "with `gpufleet hosts token HOST` and put it in the token file")  # fmt: skip
    return f"{url} answered {answer.status}: {answer.message}"


def _drain_of(text: str) -> str | None:
    """The server's word on the host's drain, in its answer to a report."""
    try:
        found = json.loads(text).get("drain")
    except (ValueError, AttributeError):
        return None
    return str(found) if found else None
