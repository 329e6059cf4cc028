"""Regenerate examples/traces/demo.csv: the seeded synthetic trace `make demo` simulates.

    python scripts/make_demo_trace.py            # for examples/gitops

The shape (job sizes, durations, arrivals, team mix) comes from published Philly statistics,
with each team's demand swinging out of phase with the others so that lending, reclaim and
resume all happen (`synthetic.demo`). tests/test_sim_policies.py fails if the committed file
drifts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.model import load_fleet
from gpufleet.sim import synthetic

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gitops", type=Path, default=REPO / "examples" / "gitops")
    parser.add_argument("--out", type=Path, default=REPO / "examples" / "traces" / "demo.csv")
    args = parser.parse_args()
    loaded = load_fleet([args.gitops])
    if loaded.problems:
        raise SystemExit(f"{args.gitops} has problems: run gpufleet validate {args.gitops}")
    jobs = synthetic.demo(loaded.fleet)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(synthetic.to_csv(jobs))
    print(f"{len(jobs)} jobs written to {args.out}")


if __name__ == "__main__":
    main()
