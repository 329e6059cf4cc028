"""Azure pools: validated against the VM sizes gpufleet knows, rendered into NodePools and
AKSNodeClasses that match the CRDs of Karpenter's Azure provider (its Go module), the example's
and a held-out pool's alike; kwok's shapes of the sizes."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, module_crds
from crdschema import CRDSchemas
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.model import load_fleet, validate_paths
from gpufleet.model.azure import AZURE_GPU_SIZES, per_gpu_hour
from gpufleet.render import Target, render, to_yaml
from gpufleet.render.karpenter import kwok_instance_types

AZURE = REPO / "examples" / "azure"
GOLDEN = Path(__file__).parent / "golden" / "render-karpenter-azure.yaml"


def pool(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "GPUPool",
        "metadata": {"name": name},
        "spec": {"provider": "azure", "gpuType": "H200", "gpusPerNode": 8, "maxGPUs": 32,
                 "instanceTypes": ["Standard_ND96isr_H200_v5"], **spec},
    }  # fmt: skip


def problems_of(tmp_path: Path, *objects: dict[str, Any]) -> list[str]:
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    _, problems = validate_paths([path])
    return [str(p) for p in problems if p.severity == "error"]


def test_the_azure_example_renders_as_its_golden_file() -> None:
    loaded = load_fleet([AZURE])
    assert loaded.problems == []
    text = to_yaml(render(loaded.fleet, Target.KARPENTER_AZURE))
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert render(loaded.fleet, Target.KARPENTER_AWS) == []  # an Azure pool is Azure's only


def test_azure_objects_match_the_providers_crds(tmp_path: Path) -> None:
    """The example's pools and a held-out one (a size, zones and image not in the examples)
    against the CRDs of karpenter-provider-azure (hack/k8s/build.sh copies them)."""
    schemas = CRDSchemas(sorted(module_crds("karpenter-azure-crds").glob("*.yaml")))
    held_out = pool("westeurope-h200", zones=["westeurope-3"], capacityTypes=["spot"],
                    azure={"imageFamily": "AzureLinux", "osDiskSizeGB": 1024})  # fmt: skip
    path = tmp_path / "held-out.yaml"
    path.write_text(yaml.safe_dump(held_out))
    fleet, problems = validate_paths([AZURE, path])
    assert [p for p in problems if p.severity == "error"] == []
    objects = render(fleet, Target.KARPENTER_AZURE)
    assert {o["kind"] for o in objects if schemas.knows(o)} == {"NodePool", "AKSNodeClass"}
    assert len(objects) == 2 * 3
    assert [e for o in objects for e in schemas.errors(o)] == []
    node_class = next(o for o in objects if o["metadata"]["name"] == "westeurope-h200"
                      and o["kind"] == "AKSNodeClass")  # fmt: skip
    assert node_class["spec"]["imageFamily"] == "AzureLinux"
    broken = copy.deepcopy(node_class)
    broken["spec"]["imageFamily"] = "Windows2022"  # the CRD's enum refuses it: the check bites
    assert schemas.errors(broken)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"instanceTypes": ["Standard_ND96isr_H200_v6"]},
            "'Standard_ND96isr_H200_v6' is not an Azure GPU VM size gpufleet knows (did you mean "
            "'Standard_ND96isr_H200_v5'?); the H200 sizes are Standard_ND96isr_H200_v5",
        ),
        (
            {"instanceTypes": ["Standard_NC24ads_A100_v4"]},
            "Standard_NC24ads_A100_v4 holds A100 GPUs, not the pool's gpuType H200",
        ),
        (
            {"gpuType": "A100", "instanceTypes": ["Standard_NC24ads_A100_v4"]},
            "Standard_NC24ads_A100_v4 has 1 GPU, not the pool's gpusPerNode 8",
        ),
        ({"zones": ["eastus2"]}, "'eastus2' is not an AKS zone label: write <region>-<n>"),
        (
            {"capacityTypes": ["reserved"]},
            "'reserved' is not supported by karpenter-provider-azure",
        ),
        ({"instanceTypes": []}, "an Azure pool needs instanceTypes (the VM sizes Karpenter may"),
        ({"aws": {"amiAlias": "al2023@v20251112"}}, "aws settings on an Azure pool have no effect"),
    ],
)
def test_a_bad_azure_pool_is_a_located_error(
    tmp_path: Path, spec: dict[str, Any], message: str
) -> None:
    found = problems_of(tmp_path, pool("p", **spec))
    assert any(message in p for p in found), found


def test_validate_refuses_an_unknown_size_with_a_did_you_mean(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump(pool("p", instanceTypes=["standard_nd96isr_h100_v5",
                                                             "Standard_ND96isr_H100_v4"],
                                        gpuType="H100")))  # fmt: skip
    done = CliRunner().invoke(app, ["validate", str(path)])
    assert done.exit_code == 1
    assert "did you mean 'Standard_ND96isr_H100_v5'?" in done.output
    assert "1 error," in done.output  # Azure's names are case-insensitive: the first is known
    fleet = load_fleet([path]).fleet
    (nodepool,) = [o for o in render(fleet, Target.KARPENTER_AZURE) if o["kind"] == "NodePool"]
    sizes = nodepool["spec"]["template"]["spec"]["requirements"][0]["values"]
    assert sizes[0] == "Standard_ND96isr_H100_v5"  # as Azure spells it on its nodes' labels


def test_kwok_launches_azure_sizes_with_their_shapes() -> None:
    fleet = load_fleet([AZURE]).fleet
    types = {t["name"]: t for t in kwok_instance_types(fleet)}
    nd = types["Standard_ND96isr_H100_v5"]
    size = AZURE_GPU_SIZES["Standard_ND96isr_H100_v5"]
    assert nd["resources"]["cpu"] == str(size.vcpus)
    assert nd["resources"]["memory"] == f"{size.memory_gib}Gi"
    assert nd["resources"]["nvidia.com/gpu"] == "8"
    offers = {(o["Requirements"][0]["values"][0], o["Price"])
              for o in types["Standard_NC24ads_A100_v4"]["offerings"]}  # fmt: skip
    assert offers == {("spot", 1.1), ("on-demand", 3.67)}
    assert per_gpu_hour("Standard_ND96isr_H100_v5") == 12.29


@pytest.fixture
def azure_api(tmp_path: Path) -> Any:
    from azure_api import AzureApi

    api = AzureApi(tmp_path)
    yield api
    api.close()


def preflight(api: Any, *paths: Path, cluster: str | None = "ml-rg/gpufleet") -> list[str]:
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.containerservice import ContainerServiceClient
    from azure_api import SUBSCRIPTION, StaticCredential

    from gpufleet.preflight.azure import gather
    from gpufleet.preflight.checks import azure_problems

    fleet = load_fleet(list(paths)).fleet
    credential = StaticCredential()
    facts = gather(
        fleet,
        "eastus",
        ComputeManagementClient(credential, SUBSCRIPTION, **api.options),
        ContainerServiceClient(credential, SUBSCRIPTION, **api.options),
        tuple(cluster.split("/")) if cluster else None,  # type: ignore[arg-type]
    )
    return [f"{p.severity}: {p.message}" for p in azure_problems(fleet, facts)]


def test_preflight_azure_finds_what_would_fail(azure_api: Any, tmp_path: Path) -> None:
    """The example's pools and a held-out H200 pool against the subscription's answers: a
    size restricted to it, zones, each quota at maxGPUs, and the cluster's settings."""
    held_out = tmp_path / "h200.yaml"
    held_out.write_text(yaml.safe_dump(pool("eastus-h200", zones=["eastus-1"])))
    found = preflight(azure_api, AZURE, held_out)
    expected = [
        "error: GPUPool/eastus-h200: Standard_ND96isr_H200_v5 is not available to this "
        "subscription in eastus (NotAvailableForSubscription)",
        "warning: GPUPool/eastus-h100: Standard_ND96isr_H100_v5 is not offered in eastus-2",
        "error: GPUPool/eastus-a100-spot: quota cores leaves 310 of 350 vCPUs in eastus; "
        "eastus-a100-spot, eastus-h100 can grow to 1152",
        "error: GPUPool/eastus-a100-spot: quota lowprioritycores leaves 100 of 100 vCPUs in "
        "eastus; eastus-a100-spot can grow to 384",
        "error: GPUPool/eastus-a100-spot: quota standardncadsa100v4family leaves 24 of 48",
        "error: GPUPool/eastus-h100: quota standardndsh100v5family leaves 96 of 96 vCPUs in "
        "eastus; eastus-h100 can grow to 768",
        "error: GPUPool/eastus-a100-spot: AKS cluster gpufleet: node auto-provisioning "
        "(Karpenter) is off",
        "error: GPUPool/eastus-a100-spot: AKS cluster gpufleet: networkDataplane is 'azure'; "
        "node auto-provisioning needs 'cilium'",
        "warning: GPUPool/eastus-a100-spot: AKS cluster gpufleet: workload identity or the OIDC "
        "issuer is off",
    ]
    for message in expected:
        assert any(f.startswith(message) for f in found), (message, "\n".join(found))
    assert len(found) == len(expected), found
    (skus,) = [q for p, q in azure_api.requests if p.endswith("/skus")]
    assert skus["$filter"] == ["location eq 'eastus'"] and skus["api-version"]


def test_preflight_azure_passes_where_azure_can_deliver(
    azure_api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quotas raised and the cluster set up as infra/azure builds it: nothing to say, through
    the CLI with the SDK's own clients."""
    for usage in azure_api.answers[r"/providers/Microsoft\.Compute/locations/eastus/usages$"][
        "value"
    ]:
        usage["limit"] = 2000
    props = azure_api.answers[next(k for k in azure_api.answers if "managedClusters" in k)][
        "properties"
    ]
    props["nodeProvisioningProfile"]["mode"] = "Auto"
    props["networkProfile"]["networkDataplane"] = "cilium"
    props["securityProfile"]["workloadIdentity"]["enabled"] = True
    skus = azure_api.answers[r"/providers/Microsoft\.Compute/skus$"]["value"]
    skus[0]["restrictions"] = []
    import azure.identity
    from azure_api import SUBSCRIPTION, StaticCredential

    from gpufleet.cli import preflight as preflight_cli

    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", StaticCredential)
    monkeypatch.setattr(preflight_cli, "AZURE_CLIENT_OPTIONS", azure_api.options)
    done = CliRunner().invoke(app, ["preflight", "azure", "-g", str(AZURE), "--subscription",
                                    SUBSCRIPTION, "--region", "eastus", "--cluster",
                                    "ml-rg/gpufleet"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "all checks pass" in done.output
    bad = CliRunner().invoke(app, ["preflight", "azure", "-g", str(AZURE), "--subscription",
                                   SUBSCRIPTION, "--region", "eastus", "--cluster",
                                   "gpufleet"])  # fmt: skip
    assert bad.exit_code == 1 and "write RESOURCE_GROUP/NAME" in bad.output
    missing = CliRunner().invoke(app, ["preflight", "azure", "-g", str(AZURE), "--subscription",
                                       SUBSCRIPTION, "--region", "eastus", "--cluster",
                                       "ml-rg/other"])  # fmt: skip
    assert missing.exit_code == 1 and "Azure refused the preflight calls" in missing.output
    assert "Traceback" not in missing.output


def test_prices_azure_reads_the_retail_prices_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against a local server answering in the Retail Prices API's shape (two pages; Windows,
    Low Priority and Dev/Test meters among them, which are not the prices a pool pays)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    from gpufleet.model import azure

    data = REPO / "tests" / "data" / "azure"
    asked: list[dict[str, list[str]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            asked.append(parse_qs(url.query))
            page = json.loads((data / f"retail-prices-eastus-{url.path[-1]}.json").read_text())
            if page["NextPageLink"]:
                page["NextPageLink"] = f"http://127.0.0.1:{port}/p/2"
            body = json.dumps(page).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(azure, "RETAIL_PRICES_URL", f"http://127.0.0.1:{port}/p/1")
    try:
        done = CliRunner().invoke(app, ["prices", "azure", "--region", "eastus", "-g", str(AZURE),
                                        "-o", "json"])  # fmt: skip
    finally:
        server.shutdown()
    assert done.exit_code == 0, done.output
    answer = json.loads(done.stdout)
    rows = {r["size"]: r for r in answer["sizes"]}
    assert rows["Standard_ND96isr_H100_v5"]["onDemandPerHour"] == 98.32
    assert rows["Standard_ND96isr_H100_v5"]["spotPerGPUHour"] == round(39.33 / 8, 4)
    assert rows["Standard_NC24ads_A100_v4"]["onDemandPerHour"] == 3.673  # not Dev/Test's
    assert answer["pools"]["eastus-a100-spot"] == {"onDemand": 3.673, "spot": 1.1019}
    (first, second) = asked
    assert "armRegionName eq 'eastus'" in first["$filter"][0] and "$filter" not in second
    assert "armSkuName eq 'Standard_NC24ads_A100_v4'" in first["$filter"][0]
