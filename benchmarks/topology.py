"""Topology-aware gangs: how many multi-node gangs the engine places inside one network block,
with the nodes' blocks known to it and without. Prints JSON; not a timed test.

    python benchmarks/topology.py                      # 64 nodes in blocks of 8, 10 seeds
    python benchmarks/topology.py --nodes 128 --block-nodes 16 --seeds 20

The training cluster of `benchmarks/lemons.py --training-cluster`: NODES 8-GPU nodes, half of
them reserved for a team whose work is multi-node gangs (2, 4 or 8 nodes, 6 to 48 hours), the
rest shared with a research team's bursts of small jobs (1 to 8 GPUs); a seeded week per seed.
Each week is simulated twice on the same nodes, grouped in blocks of BLOCK_NODES nodes: once
with the blocks on the nodes (`gpufleet.io/block`, which the engine places a gang inside when
one has room) and once topology-blind. Per seed, one JSON line: the gangs that ran, the share
whose (last) placement is inside one block, the blocks a gang spans on average, the mean wait
of gangs and the allocation rate, each way; then a summary over all seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lemons import WEEK_S, training_cluster, training_week

from gpufleet.sim.simulator import SimResult, simulate


def gangs_in_one_block(result: SimResult, block_nodes: int) -> dict[str, Any]:
    """Among the gangs that ran on several nodes: how many sit inside one block (node
    `{pool}-{i}` is in block (i - 1) // block_nodes, as `cluster_nodes` numbers them)."""
    spread, inside, waits, spans = 0, 0, [], []
    for job in result.jobs:
        if job.spec.pods < 2 or job.first_start is None:
            continue
        nodes = set(job.nodes)
        if len(nodes) < 2:
            continue
        spread += 1
        blocks = {(int(name.rsplit("-", 1)[1]) - 1) // block_nodes for name in nodes}
        inside += len(blocks) == 1
        spans.append(len(blocks))
        waits.append(job.first_start - job.submitted)
    return {
        "gangs": spread,
        "in_one_block": inside,
        "share_in_one_block": round(inside / spread, 3) if spread else None,
        "mean_blocks_per_gang": round(statistics.fmean(spans), 2) if spans else None,
        "mean_gang_wait_h": round(statistics.fmean(waits) / 3600, 2) if waits else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64, help="8-GPU nodes (default 64)")
    parser.add_argument("--block-nodes", type=int, default=8, help="nodes per block (8)")
    parser.add_argument("--seeds", type=int, default=10, help="weeks, one per seed (10)")
    args = parser.parse_args(argv)
    if args.nodes < 2 or args.block_nodes < 1 or args.seeds < 1:
        parser.error("--nodes must be at least 2, --block-nodes and --seeds at least 1")
    fleet = training_cluster(args.nodes)
    totals: dict[str, dict[str, float]] = {}
    for seed in range(1, args.seeds + 1):
        jobs = training_week(seed)
        row: dict[str, Any] = {"seed": seed, "jobs": len(jobs)}
        for label, blocks in (("topology_aware", args.block_nodes), ("blind", None)):
            result = simulate(fleet, jobs, horizon_s=WEEK_S, block_nodes=blocks)
            row[label] = {
                **gangs_in_one_block(result, args.block_nodes),
                "allocation_rate": result.metrics()["allocation_rate"],
            }
            total = totals.setdefault(
                label, {"gangs": 0, "in_one_block": 0, "allocation": 0.0, "blocks": 0.0}
            )
            total["gangs"] += row[label]["gangs"]
            total["blocks"] += (row[label]["mean_blocks_per_gang"] or 0) * row[label]["gangs"]
            total["in_one_block"] += row[label]["in_one_block"]
            total["allocation"] += row[label]["allocation_rate"] / args.seeds
        print(json.dumps(row), flush=True)
    summary = {
        "nodes": args.nodes,
        "block_nodes": args.block_nodes,
        "seeds": args.seeds,
        **{
            label: {
                "gangs": int(t["gangs"]),
                "share_in_one_block": round(t["in_one_block"] / t["gangs"], 3)
                if t["gangs"]
                else None,
                "mean_blocks_per_gang": round(t["blocks"] / t["gangs"], 2) if t["gangs"] else None,
                "mean_allocation_rate": round(t["allocation"], 4),
            }
            for label, t in totals.items()
        },
    }
    print(json.dumps({"summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
