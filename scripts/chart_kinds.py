"""Write the chart's per-kind rules (charts/gpufleet/templates/_kinds.tpl) from the workload-kind
registry and its tenancy admission policy (admission-policy.yaml): `make chart-kinds` after
adding a kind or changing the policy. tests/test_chart_kinds.py fails on drift."""

from __future__ import annotations

from pathlib import Path

from gpufleet.kube.chart import POLICY_TEMPLATE, TEMPLATE, kinds_template, policy_template

if __name__ == "__main__":
    for name, text in ((TEMPLATE, kinds_template()), (POLICY_TEMPLATE, policy_template())):
        path = Path(__file__).resolve().parent.parent / name
        path.write_text(text)
        print(f"wrote {path}")
