"""What a change to the GitOps folder does: the object diff and its simulated impact.

Pure: takes two fleets and their simulation results, returns a plan (a dict fit for JSON) and
its Markdown form for a pull-request comment. The CLI shell (`gpufleet plan`) loads, runs the
simulator and prints.
"""

from __future__ import annotations

from typing import Any

from gpufleet.model.fleet import Fleet
from gpufleet.render import Target, render
from gpufleet.render.common import Manifest

Key = tuple[str, str]  # (kind, name)


def gitops_objects(fleet: Fleet) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for group in (fleet.clusters, fleet.pools, fleet.teams, fleet.reservations, fleet.policies):
        for name, obj in group.items():
            out[(obj.kind_name, name)] = obj.model_dump(mode="json", by_alias=True)
    return out


def _rendered_objects(fleet: Fleet) -> dict[Key, Manifest]:
    return {(m["kind"], m["metadata"]["name"]): m for m in render(fleet, Target.ALL)}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _changes(old: Any, new: Any) -> list[dict[str, Any]]:
    before, after = _flatten(old), _flatten(new)
    return [
        {"field": path, "from": before.get(path), "to": after.get(path)}
        for path in sorted(set(before) | set(after))
        if before.get(path) != after.get(path)
    ]


def object_diff(old: dict[Key, Any], new: dict[Key, Any]) -> list[dict[str, Any]]:
    diff: list[dict[str, Any]] = []
    for key in sorted(set(old) | set(new)):
        kind, name = key
        if key not in old:
            diff.append({"kind": kind, "name": name, "change": "added"})
        elif key not in new:
            diff.append({"kind": kind, "name": name, "change": "removed"})
        elif old[key] != new[key]:
            diff.append(
                {
                    "kind": kind,
                    "name": name,
                    "change": "changed",
                    "fields": _changes(old[key], new[key]),
                }
            )
    return diff


IMPACT_KEYS = (
    ("allocation_rate", "Allocation rate", "percent"),
    ("idle_gpu_hours_with_demand", "Idle GPU-hours while work waited", "number"),
    ("preemptions", "Preemptions", "number"),
    ("gpu_hours_lost", "GPU-hours lost to preemption", "number"),
    ("reserved_guarantee_violations", "Reserved-guarantee violations", "number"),
    ("never_started", "Jobs never started", "number"),
    ("fairness_deviation", "Fairness deviation", "number"),
)


def touched_clusters(baseline: Fleet, proposed: Fleet, changes: list[dict[str, Any]]) -> list[str]:
    """The clusters of a fleet a change reaches: those whose Cluster, pools or pools'
    reservations it changes, and every one when it changes a team or a policy (every
    controller enforces those). None for a fleet of one cluster."""
    clusters = sorted(set(baseline.clusters) | set(proposed.clusters))
    if not clusters:
        return []
    touched: set[str] = set()
    for change in changes:
        kind, name = change["kind"], change["name"]
        if kind in ("Team", "FleetPolicy"):
            return clusters
        if kind == "Cluster":
            touched.add(name)
        for fleet in (baseline, proposed):
            if kind == "GPUPool" and name in fleet.pools:
                touched.add(fleet.pools[name].spec.cluster or "")
            if kind == "Reservation" and name in fleet.reservations:
                pool = fleet.pools.get(fleet.reservations[name].spec.pool)
                touched.add((pool.spec.cluster or "") if pool is not None else "")
    return sorted(touched - {""})


# each cluster's figures in a fleet's plan: (key, label, kind)
CLUSTER_KEYS = (
    ("capacity_gpus", "GPUs", "number"),
    ("allocation", "allocation", "percent"),
    ("jobs_started", "jobs run", "number"),
    ("mean_queue_delay_s", "mean queue delay (s)", "number"),
    ("preemptions", "preemptions", "number"),
)


def by_cluster(
    baseline_metrics: dict[str, Any], proposed_metrics: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Each cluster's figures before and after, for a fleet whose pools name clusters (the
    simulation is one engine over every cluster's pools, as the hub dispatches); {} otherwise."""
    before = baseline_metrics.get("clusters") or {}
    after = proposed_metrics.get("clusters") or {}
    return {
        cluster: {
            key: {
                "baseline": before.get(cluster, {}).get(key),
                "proposed": after.get(cluster, {}).get(key),
            }
            for key, _, _ in CLUSTER_KEYS
        }
        for cluster in sorted(set(before) | set(after))
    }


def make_plan(
    baseline: Fleet,
    proposed: Fleet,
    baseline_metrics: dict[str, Any],
    proposed_metrics: dict[str, Any],
    trace: str,
) -> dict[str, Any]:
    impact = {
        key: {
            "baseline": baseline_metrics.get(key),
            "proposed": proposed_metrics.get(key),
        }
        for key, _, _ in IMPACT_KEYS
    }
    cost = {
        "baseline": baseline_metrics.get("cost_usd"),
        "proposed": proposed_metrics.get("cost_usd"),
    }
    teams = {}
    for team in sorted(set(baseline_metrics["teams"]) | set(proposed_metrics["teams"])):
        before = baseline_metrics["teams"].get(team, {})
        after = proposed_metrics["teams"].get(team, {})
        teams[team] = {
            field: {"baseline": before.get(field), "proposed": after.get(field)}
            for field in ("reserved_gpus", "mean_allocated_gpus", "mean_queue_delay_s")
        }
    changes = object_diff(gitops_objects(baseline), gitops_objects(proposed))
    return {
        "gitops_changes": changes,
        "clusters": touched_clusters(baseline, proposed, changes),
        "by_cluster": by_cluster(baseline_metrics, proposed_metrics),
        "rendered_changes": object_diff(_rendered_objects(baseline), _rendered_objects(proposed)),
        "trace": trace,
        "impact": impact,
        "cost_usd": cost,
        "teams": teams,
    }


def _fmt(value: Any, kind: str = "number") -> str:
    if value is None:
        return "–"
    if kind == "percent":
        return f"{100 * value:.1f} %"
    if isinstance(value, float):
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    return f"{value:,}" if isinstance(value, int) else str(value)


def _delta(before: Any, after: Any, kind: str = "number") -> str:
    if not isinstance(before, int | float) or not isinstance(after, int | float):
        return ""
    diff = after - before
    if diff == 0:
        return "="
    if kind == "percent":
        return f"{100 * diff:+.1f} pts"
    return f"{diff:+,.2f}".rstrip("0").rstrip(".")


def to_markdown(plan: dict[str, Any]) -> str:
    lines = ["## gpufleet plan", ""]
    changes = plan["gitops_changes"]
    if not changes:
        lines.append("No change to pools, teams, reservations or policies.")
    else:
        lines.append(f"### GitOps objects ({len(changes)} changed)")
        lines.append("")
        for c in changes:
            lines.append(f"- **{c['change']}** {c['kind']}/{c['name']}")
            for f in c.get("fields", []):
                lines.append(f"  - `{f['field']}`: {_fmt(f['from'])} → {_fmt(f['to'])}")
    if plan.get("clusters"):
        lines += ["", f"Clusters of the fleet this change reaches: {', '.join(plan['clusters'])}."]
    rendered = plan["rendered_changes"]
    lines += ["", f"### Rendered cluster objects ({len(rendered)} changed)", ""]
    if not rendered:
        lines.append("`gpufleet render` output is unchanged.")
    for c in rendered:
        fields = c.get("fields", [])
        what = f" ({', '.join(f['field'] for f in fields[:4])}{'…' if len(fields) > 4 else ''})"
        lines.append(f"- **{c['change']}** {c['kind']}/{c['name']}{what if fields else ''}")
    lines += [
        "",
        f"### Simulated impact on `{plan['trace']}`",
        "",
        "| | baseline | proposed | change |",
        "|---|---:|---:|---:|",
    ]
    for key, label, kind in IMPACT_KEYS:
        v = plan["impact"][key]
        lines.append(
            f"| {label} | {_fmt(v['baseline'], kind)} | {_fmt(v['proposed'], kind)} | "
            f"{_delta(v['baseline'], v['proposed'], kind)} |"
        )
    cost = plan["cost_usd"]
    if cost["baseline"] and cost["proposed"]:
        for part, label in (
            ("capacity", "Cost of all GPUs (USD)"),
            ("idle", "Cost of idle GPUs (USD)"),
        ):
            before, after = cost["baseline"][part], cost["proposed"][part]
            lines.append(f"| {label} | {_fmt(before)} | {_fmt(after)} | {_delta(before, after)} |")
    clusters = plan.get("by_cluster") or {}
    if clusters:
        lines += [
            "",
            "| cluster | " + " | ".join(label for _, label, _ in CLUSTER_KEYS) + " |",
            "|---|" + "---:|" * len(CLUSTER_KEYS),
        ]
        for cluster, figures in clusters.items():
            cells = [
                f"{_fmt(figures[key]['baseline'], kind)} → {_fmt(figures[key]['proposed'], kind)}"
                for key, _, kind in CLUSTER_KEYS
            ]
            touched = " (changed)" if cluster in plan.get("clusters", []) else ""
            lines.append(f"| {cluster}{touched} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| team | reserved GPUs | mean allocated GPUs | mean queue delay (s) |",
        "|---|---:|---:|---:|",
    ]
    for team, v in plan["teams"].items():
        cells = [
            f"{_fmt(v[f]['baseline'])} → {_fmt(v[f]['proposed'])}"
            for f in ("reserved_gpus", "mean_allocated_gpus", "mean_queue_delay_s")
        ]
        lines.append(f"| {team} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
