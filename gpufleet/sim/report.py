"""The simulation report: one self-contained HTML file (inline SVG charts, no network needed).

Charts: allocated vs reserved GPUs per team over time, queue depth, idle capacity, waits per
team, preemptions per team, and gpufleet against the static-partition baseline on the same
trace. A few lines of inline script check that every chart drew something and mark the page
(`data-charts-ok`), which the browser test reads.
"""

from __future__ import annotations

import html
import json
from typing import Any

from gpufleet.sim.simulator import SimResult

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
WIDTH, HEIGHT, PAD = 760, 260, 48

Series = dict[str, list[tuple[float, float]]]


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _ticks(top: float, count: int = 4) -> list[float]:
    if top <= 0:
        return [0.0]
    return [top * i / count for i in range(count + 1)]


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:,.2g}"


def line_chart(
    chart_id: str, title: str, series: Series, y_label: str, dashed: Series | None = None
) -> str:
    """Lines over simulated hours; `dashed` series are drawn as reference levels."""
    everything = [p for s in (series, dashed or {}) for line in s.values() for p in line]
    x_max = max((x for x, _ in everything), default=1.0) or 1.0
    y_max = max((y for _, y in everything), default=1.0) * 1.05 or 1.0
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD

    def point(x: float, y: float) -> str:
        return f"{PAD + inner_w * x / x_max:.1f},{HEIGHT - PAD - inner_h * y / y_max:.1f}"

    parts = [_axes(x_max, y_max, y_label, "hours since the start of the trace")]
    colors = _colors([*series, *(dashed or {})])
    for name, line in series.items():
        if line:
            points = " ".join(point(x, y) for x, y in line)
            parts.append(
                f'<polyline class="series" fill="none" stroke="{colors[name]}" '
                f'stroke-width="1.8" points="{points}"><title>{_esc(name)}</title></polyline>'
            )
    for name, line in (dashed or {}).items():
        if line:
            points = " ".join(point(x, y) for x, y in line)
            parts.append(
                f'<polyline fill="none" stroke="{colors[name]}" stroke-dasharray="5,4" '
                f'stroke-width="1.2" points="{points}"><title>{_esc(name)}</title></polyline>'
            )
    return _figure(chart_id, title, parts, colors)


def bar_chart(chart_id: str, title: str, groups: dict[str, dict[str, float]], y_label: str) -> str:
    """Grouped bars: one group per category (team), one bar per series (policy or statistic)."""
    names = sorted({s for bars in groups.values() for s in bars})
    y_max = max((v for bars in groups.values() for v in bars.values()), default=1.0) * 1.1 or 1.0
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    slot = inner_w / max(len(groups), 1)
    bar = slot * 0.8 / max(len(names), 1)
    colors = _colors(names)
    parts = [_axes(None, y_max, y_label, "")]
    for i, (group, bars) in enumerate(groups.items()):
        x0 = PAD + i * slot + slot * 0.1
        for j, name in enumerate(names):
            value = bars.get(name)
            if value is None:
                continue
            h = inner_h * max(value, 0) / y_max
            parts.append(
                f'<rect class="series" x="{x0 + j * bar:.1f}" y="{HEIGHT - PAD - h:.1f}" '
                f'width="{bar * 0.9:.1f}" height="{h:.1f}" fill="{colors[name]}">'
                f"<title>{_esc(group)} / {_esc(name)}: {_fmt(value)}</title></rect>"
            )
        parts.append(
            f'<text x="{PAD + i * slot + slot / 2:.1f}" y="{HEIGHT - PAD + 14}" '
            f'text-anchor="middle" font-size="10">{_esc(group)[:14]}</text>'
        )
    return _figure(chart_id, title, parts, colors)


def _axes(x_max: float | None, y_max: float, y_label: str, x_label: str) -> str:
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    out = [
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
        'stroke="#444"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>',
        f'<text x="12" y="{PAD - 14}" font-size="11">{_esc(y_label)}</text>',
    ]
    for tick in _ticks(y_max):
        y = HEIGHT - PAD - inner_h * tick / y_max
        out.append(
            f'<text x="{PAD - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
            f"{_fmt(tick)}</text>"
            f'<line x1="{PAD}" y1="{y:.1f}" x2="{WIDTH - PAD}" y2="{y:.1f}" stroke="#eee"/>'
        )
    if x_max is not None:
        for tick in _ticks(x_max):
            x = PAD + inner_w * tick / x_max
            out.append(
                f'<text x="{x:.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle" '
                f'font-size="10">{_fmt(tick)}</text>'
            )
        out.append(
            f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle" font-size="11">'
            f"{_esc(x_label)}</text>"
        )
    return "".join(out)


def _colors(names: list[str]) -> dict[str, str]:
    unique = list(dict.fromkeys(n.removesuffix(" (reserved)") for n in names))
    base = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(unique)}
    return {n: base[n.removesuffix(" (reserved)")] for n in names}


def _figure(chart_id: str, title: str, parts: list[str], colors: dict[str, str]) -> str:
    legend = "".join(
        f'<span class="key"><i style="background:{c}"></i>{_esc(n)}</span>'
        for n, c in colors.items()
    )
    return (
        f'<figure id="{_esc(chart_id)}" class="chart"><figcaption>{_esc(title)}</figcaption>'
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">'
        f'{"".join(parts)}</svg><div class="legend">{legend}</div></figure>'
    )


def _hours(timeline: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [(p["t"] / 3600, float(p[key])) for p in timeline]


def _team_series(result: SimResult) -> tuple[Series, Series]:
    teams = sorted({j.spec.team for j in result.jobs})
    allocated = {
        t: [(p["t"] / 3600, float(p["by_team"].get(t, 0.0))) for p in result.timeline]
        for t in teams
    }
    end = result.timeline[-1]["t"] / 3600 if result.timeline else 1.0
    reserved = {
        f"{t} (reserved)": [
            (0.0, float(result.reserved_by_team[t])),
            (end, float(result.reserved_by_team[t])),
        ]
        for t in teams
        if result.reserved_by_team.get(t)
    }
    return allocated, reserved


def render(
    title: str,
    result: SimResult,
    baseline: SimResult | None = None,
    safety: dict[str, float | None] | None = None,
) -> str:
    """The report of `result`, compared with `baseline` (a static-partition run) if given."""
    metrics = result.metrics()
    allocated, reserved = _team_series(result)
    idle = [(x, result.capacity_gpus - y) for x, y in _hours(result.timeline, "allocated")]
    charts = [
        line_chart(
            "allocated-vs-reserved",
            "Allocated GPUs per team over time (dashed: reserved)",
            allocated,
            "GPUs",
            reserved,
        ),
        line_chart(
            "queue-depth",
            "Queue depth: waiting jobs",
            {"waiting jobs": _hours(result.timeline, "waiting_jobs")},
            "jobs",
        ),
        line_chart(
            "idle-capacity",
            "Idle GPUs, and idle GPUs that waiting work could have used",
            {
                "idle GPUs": idle,
                "idle with demand": _hours(result.timeline, "idle_with_demand"),
            },
            "GPUs",
        ),
        bar_chart(
            "waits-per-team",
            "Queue delay per team (seconds)",
            {
                key: {"p50": v["p50"], "p95": v["p95"], "mean": v["mean"]}
                for key, v in metrics["queue_delay_s"].items()
            },
            "seconds",
        ),
        line_chart(
            "preemptions-over-time",
            "Preemptions so far (lent GPUs taken back, higher-priority work)",
            {"preemptions": _hours(result.timeline, "preemptions")},
            "preemptions",
        ),
        bar_chart(
            "preemptions-per-team",
            "Preemptions per team",
            {team: {"preemptions": float(n)} for team, n in _preemptions_by_team(result).items()},
            "preemptions",
        ),
    ]
    comparison = ""
    if baseline is not None:
        base = baseline.metrics()
        charts.append(
            bar_chart(
                "versus-static-partition",
                "Mean queue delay per team: gpufleet against a static partition (seconds)",
                {
                    team: {
                        result.policy: v["mean_queue_delay_s"] or 0.0,
                        baseline.policy: base["teams"][team]["mean_queue_delay_s"] or 0.0,
                    }
                    for team, v in metrics["teams"].items()
                },
                "seconds",
            )
        )
        comparison = _comparison_table(metrics, base, safety or {})
    return _page(title, metrics, charts, comparison)


def _preemptions_by_team(result: SimResult) -> dict[str, int]:
    out: dict[str, int] = {}
    for job in result.jobs:
        out[job.spec.team] = out.get(job.spec.team, 0) + job.preemptions
    return dict(sorted(out.items()))


def _comparison_table(
    ours: dict[str, Any], base: dict[str, Any], safety: dict[str, float | None]
) -> str:
    rows = [
        (
            "Allocation rate",
            f"{100 * ours['allocation_rate']:.1f} %",
            f"{100 * base['allocation_rate']:.1f} %",
        ),
        (
            "Idle GPU-hours with demand",
            ours["idle_gpu_hours_with_demand"],
            base["idle_gpu_hours_with_demand"],
        ),
        ("Preemptions", ours["preemptions"], base["preemptions"]),
        (
            "Reserved-guarantee violations",
            ours["reserved_guarantee_violations"],
            base["reserved_guarantee_violations"],
        ),
        ("Jobs never started", ours["never_started"], base["never_started"]),
    ]
    body = "".join(
        f"<tr><td>{_esc(a)}</td><td>{_esc(b)}</td><td>{_esc(c)}</td></tr>" for a, b, c in rows
    )
    safety_rows = "".join(
        f"<tr><td>{_esc(team)}</td><td>{'n/a' if v is None else _esc(f'{v:+,.0f} s')}</td></tr>"
        for team, v in safety.items()
    )
    return (
        "<h2>gpufleet against a static partition of the same reservations</h2>"
        f"<table><tr><th></th><th>{_esc(ours['policy'])}</th><th>{_esc(base['policy'])}</th></tr>"
        f"{body}</table>"
        "<h3>Sharing safety: mean queue delay per team, gpufleet minus static partition "
        "(at most 0: sharing cost the team nothing)</h3>"
        f"<table><tr><th>team</th><th>difference</th></tr>{safety_rows}</table>"
    )


def lending_text(lending: dict[str, Any]) -> tuple[str, str]:
    """(reclaims, resumes) in words, for the report and the CLI summary."""
    reclaim = lending["reclaim_wait_s"]
    reclaims = f"{lending['reclaims']}" + (
        f", started {reclaim['p50']:g} s after submission (p50), {reclaim['p99']:g} s (p99)"
        if reclaim
        else ""
    )
    resume = lending["resume_wait_s"]
    resumes = f"{lending['preempted_jobs_resumed']} of {lending['preempted_jobs']}" + (
        f", after {resume['p50']:g} s (p50), {resume['p95']:g} s (p95)" if resume else ""
    )
    return reclaims, resumes


def _page(title: str, metrics: dict[str, Any], charts: list[str], comparison: str) -> str:
    cost = metrics.get("cost_usd")
    cost_text = (
        f"capacity ${cost['capacity']:,.0f}, of which idle ${cost['idle']:,.0f}"
        if cost
        else "no prices in the GitOps pools"
    )
    lending = metrics["lending"]
    summary = [
        ("Policy", metrics["policy"]),
        ("Jobs (finished)", f"{metrics['jobs']} ({metrics['finished']})"),
        ("GPUs", metrics["capacity_gpus"]),
        ("Allocation rate (while jobs arrived)", f"{100 * metrics['allocation_rate']:.1f} %"),
        (
            "Idle GPU-hours while work that could use them waited",
            metrics["idle_gpu_hours_with_demand"],
        ),
        ("Preemptions (GPU-hours lost)", f"{metrics['preemptions']} ({metrics['gpu_hours_lost']})"),
        ("GPU-hours borrowed beyond teams' reservations", lending["borrowed_gpu_hours"]),
        ("Reclaims: reserved jobs that took lent GPUs back", lending_text(lending)[0]),
        ("Preempted jobs resumed", lending_text(lending)[1]),
        ("Reserved-guarantee violations", metrics["reserved_guarantee_violations"]),
        ("Fairness deviation", metrics["fairness_deviation"]),
        ("Cost over the run", cost_text),
    ]
    rows = "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>" for k, v in summary)
    # raw text inside <script>: only "</" could end it early
    data = json.dumps({k: v for k, v in metrics.items() if k != "jct_s"}).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 820px; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }}
figure {{ margin: 18px 0; }} figcaption {{ font-weight: 600; margin-bottom: 4px; }}
.legend {{ font-size: 12px; }} .key {{ margin-right: 12px; white-space: nowrap; }}
.key i {{ display: inline-block; width: 10px; height: 10px; margin-right: 4px; }}
</style></head>
<body data-charts-ok="0">
<h1>{_esc(title)}</h1>
<table>{rows}</table>
{"".join(charts)}
{comparison}
<script type="application/json" id="metrics">{data}</script>
<script>
// mark the page once every chart has drawn at least one series (read by the browser test)
const charts = document.querySelectorAll("figure.chart");
const drawn = [...charts].filter(f => f.querySelector("svg .series")).length;
document.body.dataset.chartsOk = drawn === charts.length ? String(drawn) : "0";
console.log("gpufleet report: " + drawn + " of " + charts.length + " charts drawn");
</script>
</body></html>
"""
