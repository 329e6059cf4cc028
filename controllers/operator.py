"""The gpufleet operator: wires the watch caches, the admission webhook, the workload loop and
the health controller together, and starts them under kopf.

Each part is a module with one job: `cache` (observe the cluster), `admission` (the webhook;
`admission_process` serves it from a process of its own), `loop` (cycle = snapshot → engine →
plan → writes), `writer` (the writes, in the background), `derived` (objects rendered from the
fleet), `health` (quarantine), `leader` (one active instance).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client, config

from gpufleet.diagnose.collect import FixtureLogs, KubernetesLogs, LogReader
from gpufleet.diagnose.match import load_patterns
from gpufleet.kube.cache import (
    ClusterCache,
    Informer,
    Store,
    Watch,
    node_matters,
    start_watches,
    trim_node,
    trim_pod,
    workload_trim,
)
from gpufleet.kube.calls import API_TIMEOUT_S, KubernetesSecrets, who_am_i
from gpufleet.kube.holding import api_server_policies
from gpufleet.kube.kinds import JOB, OBJECT_KINDS
from gpufleet.metrics_server import serve as serve_metrics
from gpufleet.model.api import GROUP, VERSION, DiagnosisPattern, GPUHost
from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.pki import create_ca, issue_serving_cert
from gpufleet.render.crds import render_crds
from gpufleet.render.priorityclasses import render_priority_classes

from . import metrics
from .admission_process import AdmissionProcess
from .derived import DerivedSync
from .diagnosis import Diagnoser
from .health import HealthReconciler
from .leader import LeaderElection
from .ledger import LedgerSink
from .loop import WorkloadLoop
from .notifications import Dispatcher
from .provisioning import ProvisioningWatch
from .webhooks import WebhookRegistration
from .writer import Writer

log = logging.getLogger("gpufleet.controller")
FLEET_KINDS = ("clusters", "gpupools", "teams", "reservations", "fleetpolicies")


class Settings:
    """Process-wide settings, set by `gpufleet controller run` before kopf starts."""

    # the longest the loop sleeps without a watch event or a timer of its own (resync)
    interval = float(os.environ.get("GPUFLEET_LOOP_INTERVAL", "5.0"))
    # events closer together than this are decided in one cycle
    debounce = float(os.environ.get("GPUFLEET_DEBOUNCE", "0.05"))
    webhook_host = os.environ.get("GPUFLEET_WEBHOOK_HOST", "127.0.0.1")
    webhook_port = int(os.environ.get("GPUFLEET_WEBHOOK_PORT", "9443"))
    # per user and per controller (two dev controllers on one machine differ in their port)
    state_dir = Path(
        os.environ.get("GPUFLEET_STATE_DIR")
        or Path.home() / ".cache" / "gpufleet" / f"controller-{webhook_port}"
    )
    lease_namespace = os.environ.get("GPUFLEET_LEASE_NAMESPACE", "kube-system")
    scheduler_name = os.environ.get("GPUFLEET_SCHEDULER_NAME", "")
    metrics_host = os.environ.get("GPUFLEET_METRICS_HOST", "0.0.0.0")
    metrics_port = int(os.environ.get("GPUFLEET_METRICS_PORT", "8080"))
    # in a cluster (the Helm chart): certificates from a Secret, webhook configurations and
    # CRDs installed by the chart, so the controller needs no rights on them
    webhook_cert_dir = os.environ.get("GPUFLEET_WEBHOOK_CERT_DIR", "")
    manage_webhooks = os.environ.get("GPUFLEET_MANAGE_WEBHOOKS", "true") == "true"
    install = os.environ.get("GPUFLEET_INSTALL", "true") == "true"
    # the usage ledger (a SQLite file or a database URL); empty: no ledger is kept
    ledger = os.environ.get("GPUFLEET_LEDGER", "")
    ledger_hosts_every = float(os.environ.get("GPUFLEET_LEDGER_HOSTS_EVERY", "300"))
    # folders of diagnosis patterns besides the bundled ones (policies/diagnosis/)
    diagnosis_patterns = tuple(
        p for p in os.environ.get("GPUFLEET_DIAGNOSIS_PATTERNS", "").split(os.pathsep) if p
    )
    # read container logs from FOLDER/NAMESPACE/JOB.log instead of the API (tests; clusters
    # whose kubelets serve no logs)
    log_fixtures = os.environ.get("GPUFLEET_LOG_FIXTURES", "")


class Controller:
    """The API clients, the watch caches and the parts that read them."""

    def __init__(self) -> None:
        if not os.environ.get("KUBECONFIG") and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        else:
            config.load_kube_config(os.environ.get("KUBECONFIG"))
        configuration = client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = 32  # the writer's workers and the watches
        api = client.ApiClient(configuration)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.extensions = client.ApiextensionsV1Api(api)
        self.stop = threading.Event()
        self.cache = ClusterCache(
            [
                *(Store(kind.plural, workload_trim(kind)) for kind in OBJECT_KINDS),
                Store("pods", trim_pod),
                Store("nodes", trim_node, node_matters),
                Store("gpuworkloads"),
                *(Store(kind) for kind in FLEET_KINDS),
                # hosts report every few seconds: read by the alerts and the ledger at each
                # cycle, never a reason for one
                Store(GPUHost.plural, matters=lambda before, after: False),
            ]
        )
        self.fleet = Fleet()
        self.fleet_objects: list[dict[str, Any]] = []
        self.fleet_version = -1
        self.fleet_lock = threading.Lock()
        self.derived = DerivedSync(
            api, os.environ.get("GPUFLEET_CLUSTER_NAME", "gpufleet"), Settings.lease_namespace
        )
        self.derived.controllers = (who_am_i(api),)
        self.derived.scheduler = Settings.scheduler_name
        self.writer = Writer(self.cache, self.custom, self.core, self.cache.changed)
        self.ledger = (
            LedgerSink(Settings.ledger, self.stop, hosts_every_s=Settings.ledger_hosts_every)
            if Settings.ledger
            else None
        )
        self.notifier = Dispatcher(KubernetesSecrets(self.core), self.stop)
        if self.ledger is not None:
            self.notifier.journal = self.ledger.record_delivery
        logs: LogReader = (
            FixtureLogs(Path(Settings.log_fixtures))
            if Settings.log_fixtures
            else KubernetesLogs(self.core)
        )
        self.diagnoser = Diagnoser(
            self.core,
            self.custom,
            self.writer,
            _patterns(Settings.diagnosis_patterns),
            logs,
            self.stop,
            self.notifier.notify,
        )
        self.loop = WorkloadLoop(
            self.cache,
            self,
            LeaderElection(
                client.CoordinationV1Api(api), Settings.lease_namespace, "gpufleet-controller"
            ),
            HealthReconciler(
                self.core, Settings.lease_namespace, self.notifier.notify, self.custom
            ),
            self.writer,
            self.derived,
            self.stop,
            Settings.interval,
            Settings.debounce,
            ProvisioningWatch(api),
            self.ledger,
            self.notifier,
            self.diagnoser,
        )
        self.loop.lifecycle.subscribe(metrics.record_transitions)
        self.loop_thread: threading.Thread | None = None
        self.informers: list[Informer] = []
        self.webhooks: WebhookRegistration | None = None
        self.admission: AdmissionProcess | None = None

    def start_informers(self, timeout: float = 60) -> None:
        """Start the watches and wait until each kind has been listed once."""
        custom = functools.partial(self.custom.list_cluster_custom_object, GROUP, VERSION)
        watches: list[Watch] = [
            # every workload kind through the generic path (batch/v1 Jobs included): one
            # watch per kind, whether or not its operator is installed yet
            *(
                (
                    kind.plural,
                    functools.partial(
                        self.custom.list_cluster_custom_object,
                        kind.group,
                        kind.version,
                        kind.plural,
                    ),
                    {},
                )
                for kind in OBJECT_KINDS
            ),
            ("pods", self.core.list_pod_for_all_namespaces, {}),
            ("nodes", self.core.list_node, {}),
            ("gpuworkloads", functools.partial(custom, "gpuworkloads"), {}),
            *((kind, functools.partial(custom, kind), {}) for kind in FLEET_KINDS),
            (GPUHost.plural, functools.partial(custom, GPUHost.plural), {}),
        ]
        # every kind but batch/v1 Jobs comes with an operator that may not be installed; the
        # GPUHost CRD may be missing where a chart of before it installed the CRDs
        optional = frozenset(
            [*(kind.plural for kind in OBJECT_KINDS if kind is not JOB), GPUHost.plural]
        )
        self.informers = start_watches(self.cache, watches, self.stop, timeout, optional)

    def install(self) -> None:
        """Install our CRDs and PriorityClasses (server-side apply; idempotent)."""
        for crd in render_crds():
            self.derived.apply(crd)
        for name in [c["metadata"]["name"] for c in render_crds()]:
            self._wait_established(name)
        for priority_class in render_priority_classes():
            self.derived.apply(priority_class)

    def _wait_established(self, name: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            crd = self.extensions.read_custom_resource_definition(
                name, _request_timeout=API_TIMEOUT_S
            )
            conditions = (crd.status.conditions or []) if crd.status else []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                return
            time.sleep(0.2)
        raise RuntimeError(f"CRD {name} was not established in {timeout}s")

    def health_problem(self) -> str | None:
        """Why `/healthz` fails: a hung loop, or no webhook process to answer creates."""
        problem = self.loop.health_problem()
        if problem is None and self.admission is not None:
            problem = self.admission.health_problem()
        return problem

    def load_fleet(self) -> Fleet:
        """The fleet as the caches hold it, rebuilt only when a GitOps object changed."""
        with self.fleet_lock:
            version = sum(self.cache.versions[kind] for kind in FLEET_KINDS)
            if version == self.fleet_version:
                return self.fleet
            objects = [o for kind in FLEET_KINDS for o in self.cache.items(kind)]
            loaded = fleet_from_objects(objects)
            for problem in loaded.problems:
                log.warning("ignoring invalid object %s: %s", problem.file, problem.message)
            fleet = loaded.fleet.for_cluster(self.derived.cluster_name)
            if loaded.fleet.clusters and not fleet.clusters:
                log.error(
                    "the fleet declares the clusters %s and this controller's --cluster-name "
                    "%r is none of them: it enforces no pool; run it with one of those names",
                    ", ".join(sorted(loaded.fleet.clusters)),
                    self.derived.cluster_name,
                )
            # a worker of a fleet writes its own rows of the ledger and says which cluster it
            # is in each notification
            cluster = self.derived.cluster_name if fleet.clusters else None
            self.notifier.cluster = cluster
            if self.ledger is not None:
                self.ledger.cluster = cluster
            self.fleet, self.fleet_objects, self.fleet_version = fleet, objects, version
            return fleet


def _patterns(folders: tuple[str, ...]) -> list[DiagnosisPattern]:
    """The bundled diagnosis patterns and those in `folders`; bad files are logged and left
    out, never a reason not to start."""
    try:
        return load_patterns(folders)
    except ValueError as err:
        log.error("diagnosis patterns not loaded from %s: %s; using the bundled ones", folders, err)
        return load_patterns()


# --- kopf wiring -------------------------------------------------------------------------------

CONTROLLER: Controller | None = None


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    global CONTROLLER
    controller = Controller()
    if Settings.install:
        controller.install()
    controller.start_informers()
    controller.load_fleet()
    if Settings.webhook_cert_dir:
        # mounted from a Secret (the chart's generated certificate or cert-manager's), reached
        # through the chart's Service: listen on all interfaces
        given = Path(Settings.webhook_cert_dir)
        certfile, keyfile, address = given / "tls.crt", given / "tls.key", "0.0.0.0"
        ca_cert = given / "ca.crt" if (given / "ca.crt").exists() else certfile
    else:
        cert_dir = Settings.state_dir / "webhook"
        pki = create_ca(cert_dir)
        certfile, keyfile, address = cert_dir / "webhook.crt", cert_dir / "webhook.key", None
        issue_serving_cert(pki.ca_cert, pki.ca_key, certfile, keyfile, [Settings.webhook_host])
        ca_cert = pki.ca_cert
    controller.admission = AdmissionProcess(
        address or Settings.webhook_host,
        Settings.webhook_port,
        certfile,
        keyfile,
        controller,
        controller.cache.listen(FLEET_KINDS),
        Settings.scheduler_name or None,
    )
    controller.admission.start()
    if Settings.manage_webhooks:  # not when a chart ships the webhook configuration
        registration = client.AdmissionregistrationV1Api()
        controller.webhooks = WebhookRegistration(
            registration, Settings.webhook_host, Settings.webhook_port, ca_cert
        )
        # the policies stay when the controller stops: they never block a valid create, and
        # Jobs are held while it is down. Their params first: without them the holding policy
        # holds nothing. All before the webhook is registered, which says the controller is
        # ready: a later write of these params, from the fleet as it was at start, could
        # overwrite the loop's newer ones
        controller.derived.sync_params(controller.load_fleet())
        skip = ("kube-system", Settings.lease_namespace)
        for obj in api_server_policies(Settings.lease_namespace, skip=skip):
            controller.derived.apply(obj)
        # the cluster's own Jobs and the controller's never wait on a dev controller
        controller.webhooks.register(list(skip))
    settings.posting.level = logging.WARNING
    if Settings.metrics_port:
        serve_metrics(
            Settings.metrics_port,
            Settings.metrics_host,
            controller.health_problem,
            metrics.REGISTRY,
        )
    CONTROLLER = controller
    if controller.ledger is not None:
        controller.ledger.start()
    controller.notifier.start()
    controller.diagnoser.start()
    controller.loop_thread = threading.Thread(
        target=controller.loop.run, name="gpufleet-workload-loop", daemon=True
    )
    controller.loop_thread.start()


@kopf.on.cleanup()
def cleanup(**_: Any) -> None:
    if CONTROLLER is not None:
        CONTROLLER.stop.set()
        CONTROLLER.cache.changed.set()
        loop = CONTROLLER.loop_thread
        if loop is not None:
            loop.join(10)  # the cycle under way hands its writes over
        CONTROLLER.writer.shutdown(10)  # writes already handed over are seen through
        if loop is None or not loop.is_alive():
            # every decision written: the next controller may lead at once (a loop still in a
            # cycle keeps the Lease until it expires)
            CONTROLLER.loop.leader.release()
        if CONTROLLER.ledger is not None:
            CONTROLLER.ledger.drain(5)  # the ledger catches up on a restart if this is cut short
        if CONTROLLER.webhooks is not None:
            CONTROLLER.webhooks.remove()  # a clean exit leaves no webhook behind
        if CONTROLLER.admission is not None:
            CONTROLLER.admission.stop()
