"""Write the chart's per-kind rules (charts/gpufleet/templates/_kinds.tpl) from the workload-kind
registry: `make chart-kinds` after adding a kind. tests/test_chart_kinds.py fails on drift."""

from __future__ import annotations

from pathlib import Path

from gpufleet.kube.chart import TEMPLATE, kinds_template

if __name__ == "__main__":
    path = Path(__file__).resolve().parent.parent / TEMPLATE
    path.write_text(kinds_template())
    print(f"wrote {path}")
