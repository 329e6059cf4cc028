"""The command line: help, version, capacity output, errors without tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet import __version__
from gpufleet.cli.main import app

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = str(REPO / "examples" / "gitops")
runner = CliRunner()


@pytest.mark.parametrize(
    "command",
    ["validate", "render", "capacity", "crds", "teams", "reservations", "health", "whoami",
     "completion"],
)  # fmt: skip
def test_every_command_has_help_with_an_example(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.stdout or "Install them with" in result.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_and_the_answers_they_ask_for(shell: str) -> None:
    script = runner.invoke(app, ["completion", shell])
    assert script.exit_code == 0 and "_GPUFLEET_COMPLETE=complete_" + shell in script.stdout
    # what the script asks the command when you press TAB after `gpufleet workloads l`
    words = "gpufleet workloads l"
    env = {"_GPUFLEET_COMPLETE": f"complete_{shell}", "_TYPER_COMPLETE_ARGS": words,
           "COMP_WORDS": words, "COMP_CWORD": "2"}  # fmt: skip
    asked = subprocess.run(
        [sys.executable, "-m", "gpufleet"], env={**os.environ, **env}, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert "list" in asked.stdout, asked.stderr
    wrong = runner.invoke(app, ["completion", "tcsh"])
    assert wrong.exit_code == 1 and "use bash, zsh, fish" in wrong.output


def test_python_dash_m_and_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", "--version"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert result.stdout.strip() == f"gpufleet {__version__}"


def test_capacity_json() -> None:
    result = runner.invoke(app, ["capacity", EXAMPLE, "-o", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    pools = {p["name"]: p for p in data["pools"]}
    assert pools["us-west-h100"]["reserved_gpus"] == 128
    assert pools["us-west-h100"]["unreserved_gpus"] == 128
    # 128 reserved H100 GPUs at the reserved price of $4.10 for 730 hours
    assert pools["us-west-h100"]["reserved_cost_per_month"] == pytest.approx(128 * 4.10 * 730)
    teams = {t["name"]: t for t in data["teams"]}
    assert teams["nlp"]["reserved_gpus"] == {"us-east-a100": 16, "us-west-h100": 32}
    assert teams["nlp"]["max_usable_gpus"] == 72
    assert teams["research"]["subtree_reserved_gpus"] == 88
    assert teams["training"]["max_usable_gpus"] is None
    assert [t["name"] for t in data["teams"]][:3] == ["production", "inference", "training"]
    assert data["totals"] == {"maxGPUs": 448, "reservedGPUs": 232}


def test_capacity_yaml_and_table() -> None:
    as_yaml = runner.invoke(app, ["capacity", EXAMPLE, "-o", "yaml"])
    assert yaml.safe_load(as_yaml.stdout)["totals"]["reservedGPUs"] == 232
    table = runner.invoke(app, ["capacity", EXAMPLE])
    assert table.exit_code == 0
    assert "us-west-h100" in table.stdout
    assert "  nlp" in table.stdout  # children are indented under their parent


def test_missing_input_is_a_clear_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", "capacity", "no/such/dir"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "no/such/dir:0: error: no such file or directory" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_dev_cluster_autoscale_refuses_pools_it_cannot_launch(tmp_path: Path) -> None:
    """Refused before any process starts: nothing to autoscale, or instance types that
    contradict each other (Karpenter would only log it and launch nothing)."""
    pools = list(yaml.safe_load_all((Path(EXAMPLE) / "pools.yaml").read_text()))
    work = str(tmp_path / "dev")

    def up(docs: list[Any]) -> subprocess.CompletedProcess[str]:
        (tmp_path / "pools.yaml").write_text(yaml.safe_dump_all(docs))
        args = ["dev", "cluster", "up", "--autoscale", "--gitops", str(tmp_path / "pools.yaml")]
        return subprocess.run(
            [sys.executable, "-m", "gpufleet", *args, "--work-dir", work],
            capture_output=True,
            text=True,
            check=False,
        )

    static = {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "GPUPool",
        "metadata": {"name": "onprem"},
        "spec": {
            "provider": "static",
            "gpuType": "H100",
            "gpusPerNode": 8,
            "maxGPUs": 16,
            "nodeSelector": {"gpufleet.io/pool": "onprem"},
        },
    }
    result = up([static])
    assert result.returncode == 1
    assert "has no autoscaling pool" in result.stderr
    pools[1]["spec"].update(gpusPerNode=4, instanceTypes=["p5.48xlarge"])  # us-west-h100's, 8
    result = up(pools)
    assert result.returncode == 1
    assert "p5.48xlarge has 4 GPUs per node in pool us-east-a100 but 8 in pool us-west-h100" in (
        result.stderr.replace("\n", " ")
    )
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "dev" / "cluster.json").exists()  # nothing was started


def test_bad_option_value_is_a_usage_error() -> None:
    result = runner.invoke(app, ["render", EXAMPLE, "--target", "kubernetes"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
