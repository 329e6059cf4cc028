"""Diagnosis of failed workloads in the controller: each managed workload that fails is
diagnosed once, from a thread of its own (collecting evidence takes a few API calls): the
result goes on its GPUWorkload status, an Event on the Job, `gpufleet_diagnoses_total` and a
`failed` notification that says why."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from gpufleet.diagnose.collect import LogReader, collect
from gpufleet.diagnose.match import Diagnosis, diagnose
from gpufleet.kube.calls import API_TIMEOUT_S
from gpufleet.kube.observe import Observed, parse_time
from gpufleet.model.api import GROUP, VERSION, DiagnosisPattern
from gpufleet.notify.messages import Notification

from . import metrics
from .writer import Writer

log = logging.getLogger("gpufleet.diagnosis")
RETRY_S = 30.0  # a diagnosis that failed (the API was down) is tried again after this


class Diagnoser:
    def __init__(
        self,
        core: client.CoreV1Api,
        custom: client.CustomObjectsApi,
        writer: Writer,
        patterns: Sequence[DiagnosisPattern],
        logs: LogReader,
        stop: threading.Event,
        notify: Callable[[Sequence[Notification]], None] | None = None,
    ) -> None:
        self.core, self.custom, self.writer = core, custom, writer
        self.patterns, self.logs, self.stop, self.notify = list(patterns), logs, stop, notify
        self.work: queue.Queue[Observed] = queue.Queue()
        self.pending: set[str] = set()
        # diagnosed, by workload and Job uid: the watch may bring the status a moment later,
        # and a workload is diagnosed once (a Job of the same name made again is a new one)
        self.done: set[tuple[str, str]] = set()
        self.failed_at: dict[str, float] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, name="gpufleet-diagnosis", daemon=True)

    def start(self) -> Diagnoser:
        self.thread.start()
        return self

    def submit(self, observed: Sequence[Observed]) -> None:
        """Queue the failed workloads not diagnosed yet (called by the loop every cycle)."""
        now = time.monotonic()
        with self.lock:
            failed = [o for o in observed if o.state == "Failed"]
            self.done &= {(o.key, _uid(o)) for o in failed}  # forget those gone
            for item in failed:
                if item.key in self.pending or (item.key, _uid(item)) in self.done:
                    continue
                if (item.workload.get("status") or {}).get("diagnosis"):
                    continue
                if now - self.failed_at.get(item.key, -RETRY_S) < RETRY_S:
                    continue
                self.pending.add(item.key)
                self.work.put(item)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                item = self.work.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.diagnose(item)
                with self.lock:
                    self.failed_at.pop(item.key, None)
                    self.done.add((item.key, _uid(item)))
            except Exception as err:  # the API is down: tried again later, never fatal
                log.warning("could not diagnose %s: %s", item.key, err)
                with self.lock:
                    self.failed_at[item.key] = time.monotonic()
            finally:
                with self.lock:
                    self.pending.discard(item.key)

    def diagnose(self, item: Observed) -> Diagnosis:
        namespace, name = item.workload["metadata"]["namespace"], item.workload["metadata"]["name"]
        evidence = collect(self.core, namespace, item.obj, self.logs)
        found = diagnose(self.patterns, evidence)
        self.custom.patch_namespaced_custom_object(  # a GPUWorkload has no status subresource
            GROUP, VERSION, namespace, "gpuworkloads", name,
            {"status": {"diagnosis": found.status()}}, _request_timeout=API_TIMEOUT_S,
        )  # fmt: skip
        metrics.DIAGNOSES.labels(found.pattern, found.owner or "unknown").inc()
        owner = f", owner: {found.owner}" if found.owner else ""
        self.writer.event(item.obj, "Diagnosed", f"{found.pattern}{owner}: {found.diagnosis}")
        if self.notify is not None:
            self.notify([failure_notification(item, found)])
        return found


def _uid(item: Observed) -> str:
    return str(item.obj["metadata"].get("uid", ""))


def failure_notification(item: Observed, found: Diagnosis) -> Notification:
    spec = item.workload.get("spec") or {}
    status = item.workload.get("status") or {}
    at = parse_time(status.get("finishedAt")) or datetime.now(UTC)
    text = found.diagnosis
    if found.actions:
        text += "\nNext: " + " ".join(found.actions)
    fields: dict[str, Any] = {"team": spec.get("team", ""), "pattern": found.pattern}
    if found.owner:
        fields["likely owner"] = found.owner
    if found.matched:
        fields["evidence"] = "; ".join(found.matched)[:300]
    return Notification(
        kind="failed",
        subject=f"{item.key}@{at.isoformat()}",
        title=f"{item.key} failed: {found.pattern}",
        text=text,
        at=at,
        team=spec.get("team"),
        severity="critical",
        fields={k: str(v) for k, v in fields.items()},
        namespace=item.key.split("/", 1)[0],
        pool=status.get("pool"),
    )
