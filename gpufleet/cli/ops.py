"""`gpufleet ops`: remediation of failed work under the policy, with approvals and an audit
log (`propose`, `approve`, `log`)."""

from __future__ import annotations

import getpass
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from gpufleet.cli.live import KUBECONFIG, ClusterReader, kube_client
from gpufleet.cli.output import OutputFormat, console, err_console, fail, print_structured
from gpufleet.ledger.store import Ledger, LedgerError, open_ledger
from gpufleet.model.api import RemediationPolicy
from gpufleet.model.fleet import load_fleet
from gpufleet.remediate.policy import judge

ops_app = typer.Typer(
    help="Remediate failed work: actions allowed by policies/remediation.yaml (deny by "
    "default), approvals for node actions, and an append-only audit log.",
    no_args_is_help=True,
)
DEFAULT_AUDIT = Path.home() / ".local" / "state" / "gpufleet" / "audit.db"
_LEDGER = typer.Option(
    None,
    "--ledger",
    envvar="GPUFLEET_LEDGER",
    help=f"Where the audit log is kept: the usage ledger (file or URL); default {DEFAULT_AUDIT}.",
)
_POLICY = typer.Option(
    Path("policies/remediation.yaml"),
    "--policy",
    help="The RemediationPolicy file(s) (a file or folder); without one every action is refused.",
)
_AS = typer.Option(None, "--as", help="Who acts (recorded); default $USER.")


@ops_app.command("propose")
def propose(
    workload: str = typer.Argument(..., help="The failed workload (its Job's name)."),
    action: str = typer.Argument(
        ..., help="collect-logs | requeue | cordon-node | propose-capacity-change"
    ),
    namespace: str = typer.Option("default", "-n", "--namespace"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check and say what would be done."),
    actor: str | None = _AS,
    policy: Path = _POLICY,
    ledger: str | None = _LEDGER,
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Propose an action for a diagnosed failed workload. The policy decides: refused (and
    recorded), carried out at once (tiers 0-1, or a pre-approved tier 2), waiting for an
    approval (tier 2), or written up as a pull request (tier 3, never applied).

    Example: gpufleet ops propose train requeue -n nlp
    """
    reader = ClusterReader(kubeconfig)
    gwl = reader.workload(namespace, workload)
    diagnosis = (gwl.get("status") or {}).get("diagnosis")
    if not diagnosis:
        raise fail(
            f"{namespace}/{workload} has no diagnosis: only diagnosed failed work is remediated "
            f"(gpufleet workloads diagnose {workload} -n {namespace})"
        )
    who = _actor(actor)
    verdict = judge(_policies(policy), action, diagnosis["pattern"], gwl["spec"]["team"])
    store = _store(ledger)
    row = {
        "actor": who,
        "workload": f"{namespace}/{workload}",
        "pattern": diagnosis["pattern"],
        "team": gwl["spec"]["team"],
        "action": action,
        "tier": verdict.tier,
    }
    now = datetime.now(UTC)
    if not verdict.allowed:
        store.audit(at=now, entry="refused", proposal=None, detail=verdict.reason, **row)
        raise fail(f"refused: {verdict.reason}")
    entry = "dry-run" if dry_run else "proposed"
    proposal = store.audit(at=now, entry=entry, proposal=None, detail=verdict.reason, **row)
    if verdict.needs_approval and not dry_run:
        console.print(
            f"proposal {proposal}: {action} for {namespace}/{workload} "
            f"({diagnosis['pattern']}) waits for an approval: gpufleet ops approve {proposal}"
        )
        return
    _carry_out(store, proposal, gwl, action, verdict.tier, who, row, dry_run, kubeconfig)


@ops_app.command("approve")
def approve(
    proposal: int = typer.Argument(..., help="The proposal's id (from propose or ops log)."),
    dry_run: bool = typer.Option(False, "--dry-run"),
    actor: str | None = _AS,
    policy: Path = _POLICY,
    ledger: str | None = _LEDGER,
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Approve a proposal that waits (tier 2) and carry it out; the approval, the action and
    its result are recorded. The policy is asked again: a rule removed since refuses it.

    Example: gpufleet ops approve 12 --as alice
    """
    store = _store(ledger)
    rows = store.audit_log(proposal)
    head = next((r for r in rows if r["id"] == proposal), None)
    if head is None or head["entry"] != "proposed":
        raise fail(f"no proposal {proposal} waiting (gpufleet ops log lists them)")
    done = [r["entry"] for r in rows if r["id"] != proposal]
    if any(e in ("approved", "executed", "failed", "refused") for e in done):
        raise fail(f"proposal {proposal} was decided already: {', '.join(done)}")
    namespace, name = head["workload"].split("/", 1)
    gwl = ClusterReader(kubeconfig).workload(namespace, name)
    who = _actor(actor)
    row = {k: head[k] for k in ("workload", "pattern", "team", "action", "tier")}
    verdict = judge(_policies(policy), head["action"], head["pattern"], head["team"])
    now = datetime.now(UTC)
    if not verdict.allowed:
        store.audit(at=now, entry="refused", proposal=proposal, actor=who, detail=verdict.reason,
                    **row)  # fmt: skip
        raise fail(f"refused: {verdict.reason}")
    if not dry_run:
        store.audit(at=now, entry="approved", proposal=proposal, actor=who,
                    detail=f"approved by {who}", **row)  # fmt: skip
    _carry_out(store, proposal, gwl, head["action"], head["tier"], who, {"actor": who, **row},
               dry_run, kubeconfig)  # fmt: skip


@ops_app.command("log")
def log_command(
    proposal: int | None = typer.Option(None, "--proposal", help="Only this proposal."),
    ledger: str | None = _LEDGER,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """The audit log: every proposal, refusal, approval and action, oldest first.

    Example: gpufleet ops log -o json
    """
    rows = _store(ledger).audit_log(proposal)
    data = [{**r, "at": r["at"].isoformat().replace("+00:00", "Z")} for r in rows]
    if print_structured(data, output):
        return
    table = Table(box=box.SIMPLE_HEAD)
    for column in (
        "ID",
        "AT",
        "ENTRY",
        "PROPOSAL",
        "ACTOR",
        "WORKLOAD",
        "ACTION",
        "TIER",
        "DETAIL",
    ):
        table.add_column(column)
    for r in data:
        cells = [r["id"], r["at"], r["entry"], r["proposal"] or "-", r["actor"], r["workload"]]
        cells += [r["action"], r["tier"], escape(r["detail"][:120])]
        table.add_row(*map(str, cells))
    console.print(table)


def _carry_out(
    store: Ledger,
    proposal: int,
    gwl: dict[str, Any],
    action: str,
    tier: int,
    who: str,
    row: dict[str, Any],
    dry_run: bool,
    kubeconfig: Path | None,
) -> None:
    from gpufleet.remediate.actions import execute

    client = kube_client(kubeconfig)
    namespace, name = gwl["metadata"]["namespace"], gwl["metadata"]["name"]
    batch = client.BatchV1Api()
    try:
        job = client.ApiClient().sanitize_for_serialization(
            batch.read_namespaced_job(name, namespace)
        )
    except client.ApiException:
        job = None
    try:
        result = execute(action, gwl, job, client.CoreV1Api(), batch, who, dry_run)
    except (ValueError, client.ApiException) as err:
        reason = getattr(err, "reason", None) or str(err)
        if not dry_run:
            store.audit(at=datetime.now(UTC), entry="failed", proposal=proposal,
                        detail=str(reason), **row)  # fmt: skip
        raise fail(f"{action} failed: {reason}") from None
    entry = "dry-run" if dry_run else ("written-up" if tier == 3 else "executed")
    if not dry_run:
        store.audit(at=datetime.now(UTC), entry=entry, proposal=proposal, detail=result, **row)
    console.print(f"proposal {proposal}: {entry}: {escape(result)}", markup=True)


def _policies(path: Path) -> list[RemediationPolicy]:
    if not path.exists():
        err_console.print(f"note: no remediation policy at {path}: every action is refused")
        return []
    loaded = load_fleet([path])
    errors = [p for p in loaded.problems if p.severity == "error"]
    if errors:
        raise fail("; ".join(f"{p.file}:{p.line}: {p.message}" for p in errors))
    return list(loaded.fleet.remediation.values())


def _store(target: str | None) -> Ledger:
    if not target:
        DEFAULT_AUDIT.parent.mkdir(parents=True, exist_ok=True)
        target = str(DEFAULT_AUDIT)
    try:
        return open_ledger(target)
    except LedgerError as err:
        raise fail(str(err)) from None


def _actor(given: str | None) -> str:
    if given:
        return given
    try:
        return os.environ.get("USER") or getpass.getuser()
    except OSError:
        return "unknown"
