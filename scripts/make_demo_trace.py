"""Regenerate examples/traces/demo.csv: the seeded synthetic trace `make demo` simulates.

    python scripts/make_demo_trace.py            # seed 42, 6 hours, for examples/gitops

The shape (job sizes, durations, arrivals, team mix) comes from published Philly statistics;
see gpufleet/sim/synthetic.py. tests/test_sim_policies.py fails if the committed file drifts.
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
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=REPO / "examples" / "traces" / "demo.csv")
    args = parser.parse_args()
    loaded = load_fleet([args.gitops])
    if loaded.problems:
        raise SystemExit(f"{args.gitops} has problems: run gpufleet validate {args.gitops}")
    jobs = synthetic.generate(loaded.fleet, seed=args.seed, hours=args.hours)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(synthetic.to_csv(jobs))
    print(f"{len(jobs)} jobs written to {args.out}")


if __name__ == "__main__":
    main()
