"""Targeted scenarios per scheduling rule (DESIGN §4 R1-R9), each through `gpufleet decide`."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from engine_helpers import admitted, gitops, nodes, pending, preempted, run_decide
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.engine import (
    Node,
    Policy,
    PoolInfo,
    PreemptionReason,
    Snapshot,
    TeamInfo,
    Workload,
    WorkloadClass,
    WorkloadState,
    decide,
)

POOL: dict[str, dict[str, Any]] = {"h100": {}}


def running(
    name: str,
    team: str,
    gpus: float,
    on: list[str],
    cls: str = "elastic",
    started: str = "2026-01-01T08:00:00Z",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "name": name,
        "team": team,
        "class": cls,
        "gpus": gpus,
        "pods": len(on),
        "state": "Running",
        "nodes": on,
        "submittedAt": "2026-01-01T07:00:00Z",
        "startedAt": started,
        **extra,
    }


def waiting(
    name: str,
    team: str,
    gpus: float,
    cls: str = "elastic",
    pods: int = 1,
    submitted: str = "2026-01-01T11:00:00Z",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "name": name,
        "team": team,
        "class": cls,
        "gpus": gpus,
        "pods": pods,
        "submittedAt": submitted,
        **extra,
    }


# --- R1 reserved capacity is guaranteed --------------------------------------------------


def test_r1_reserved_beyond_reservation_waits_even_with_free_gpus(tmp_path: Path) -> None:
    objs = gitops(POOL, {"nlp": {}}, {("nlp", "h100"): 8})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 2),
            "workloads": [
                running("a", "nlp", 8, ["h100-1"], cls="reserved"),
                waiting("b", "nlp", 4, cls="reserved"),
            ],
        },
    )
    (why,) = pending(out).values()
    assert why["reason"] == "ReservationExhausted"
    assert "8 of 8 used in h100" in why["message"]
    assert admitted(out) == {}


def test_r1_reserved_work_is_never_preempted(tmp_path: Path) -> None:
    objs = gitops(
        {"h100": {"maxGPUs": 16}}, {"a": {}, "b": {}}, {("a", "h100"): 8, ("b", "h100"): 8}
    )
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 1),  # only one of the two nodes exists; static: no scale-up
            "workloads": [
                running("a-job", "a", 8, ["h100-1"], cls="reserved"),
                waiting("b-job", "b", 8, cls="reserved"),
            ],
        },
    )
    assert preempted(out) == {}
    assert pending(out)["b-job"]["reason"] == "PoolFull"


def test_r1_r7_reserved_work_scales_an_autoscaling_pool(tmp_path: Path) -> None:
    pool = {
        "h100": {
            "provider": "aws",
            "instanceTypes": ["p5.48xlarge"],
            "maxGPUs": 24,
            "nodeSelector": {},
            "aws": {"amiAlias": "al2023@v20251112"},
        }
    }
    objs = gitops(pool, {"a": {}, "b": {}}, {("a", "h100"): 8, ("b", "h100"): 16})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 1),
            "workloads": [
                running("a-job", "a", 8, ["h100-1"], cls="reserved"),
                waiting("b-job", "b", 8, cls="reserved", pods=2),
                waiting("c-elastic", "a", 8),
            ],
        },
    )
    assert admitted(out) == {"b-job": ["h100/new-1", "h100/new-2"]}
    # R7: elastic work does not trigger new nodes unless the pool allows it
    assert pending(out)["c-elastic"]["reason"] == "PoolFull"


def test_r7_pool_may_allow_elastic_scale_up(tmp_path: Path) -> None:
    pool = {
        "h100": {
            "provider": "aws",
            "instanceTypes": ["p5.48xlarge"],
            "maxGPUs": 16,
            "nodeSelector": {},
            "allowElasticScaleUp": True,
            "aws": {"amiAlias": "al2023@v20251112"},
        }
    }
    objs = gitops(pool, {"a": {}})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 1),
            "workloads": [running("busy", "a", 8, ["h100-1"]), waiting("more", "a", 8)],
        },
    )
    assert admitted(out) == {"more": ["h100/new-1"]}


def test_r7_work_waiting_for_new_nodes_keeps_them_as_they_come_up(tmp_path: Path) -> None:
    """Two jobs were admitted to nodes to be provisioned; one node has come up (empty: the pods
    are not bound yet), so only one is left to provision. Both jobs still hold a node's worth
    of the pool, and a third job must not take the node launched for one of them."""
    pool = {
        "burst": {
            "provider": "aws",
            "instanceTypes": ["p4d.24xlarge"],
            "maxGPUs": 16,
            "nodeSelector": {},
            "allowElasticScaleUp": True,
            "aws": {"amiAlias": "al2023@v20251112"},
        }
    }

    def starting(name: str, node: str) -> dict[str, Any]:
        return {**running(name, "a", 8, [node]), "state": "Starting", "startedAt": None}

    # new-1 again: the name of a node to be provisioned holds for one cycle, and a later
    # admission reuses it
    for second in ("burst/new-2", "burst/new-1"):
        out = run_decide(
            tmp_path,
            gitops(pool, {"a": {}}),
            {
                "nodes": nodes("burst", 1),
                "workloads": [
                    starting("one", "burst/new-1"),
                    starting("two", second),
                    waiting("three", "a", 8),
                ],
            },
        )
        assert admitted(out) == {}
        assert pending(out)["three"]["reason"] == "PoolFull"
        assert preempted(out) == {}


# --- R2 elastic work uses idle capacity, within burst limits -------------------------------


def test_r2_elastic_prefers_the_pool_with_its_own_idle_reservation(tmp_path: Path) -> None:
    objs = gitops({"big": {}, "small": {}}, {"nlp": {}}, {("nlp", "small"): 8})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("big", 4) + nodes("small", 1),
            "workloads": [waiting("job", "nlp", 8)],
        },
    )
    assert admitted(out) == {"job": ["small-1"]}


def test_r2_burst_limit_caps_team_usage(tmp_path: Path) -> None:
    objs = gitops(POOL, {"nlp": {"burstLimit": "50%"}}, {("nlp", "h100"): 16})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 8),
            "workloads": [
                running("r", "nlp", 4, ["h100-1", "h100-1", "h100-2", "h100-2", "h100-3"]),
                waiting("too-big", "nlp", 8, submitted="2026-01-01T10:00:00Z"),
                waiting("fits", "nlp", 4),
            ],
        },
    )
    # 20 in use, ceiling 16 + 50 % = 24: 4 more fit, 8 more do not
    assert "fits" in admitted(out)
    why = pending(out)["too-big"]
    assert why["reason"] == "BurstLimit"
    assert "team nlp uses 24 of the 24 GPUs" in why["message"]


def test_r2_parent_burst_limit_caps_the_subtree(tmp_path: Path) -> None:
    teams = {"research": {"burstLimit": "0"}, "nlp": {"parent": "research"}}
    objs = gitops(POOL, teams, {("nlp", "h100"): 8})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 4),
            "workloads": [running("mine", "nlp", 8, ["h100-1"]), waiting("extra", "nlp", 8)],
        },
    )
    why = pending(out)["extra"]
    assert why["reason"] == "BurstLimit"
    assert "parent team research uses 8 of the 8 GPUs" in why["message"]


# --- R3 hierarchical bursting by burstingPriority ------------------------------------------


def _many(team: str, count: int, gpus: int = 8) -> list[dict[str, Any]]:
    return [
        waiting(f"{team}-{i}", team, gpus, submitted=f"2026-01-01T11:{i:02d}:00Z")
        for i in range(count)
    ]


def test_r3_surplus_is_split_by_bursting_priority(tmp_path: Path) -> None:
    objs = gitops(POOL, {"nlp": {"burstingPriority": 3}, "vision": {"burstingPriority": 2}})
    out = run_decide(
        tmp_path,
        objs,
        {"nodes": nodes("h100", 5), "workloads": _many("nlp", 10) + _many("vision", 10)},
    )
    got = admitted(out)
    assert sum(n.startswith("nlp") for n in got) == 3  # 60 % of 40 GPUs
    assert sum(n.startswith("vision") for n in got) == 2  # 40 %


def test_r3_unused_shares_flow_to_teams_that_want_more(tmp_path: Path) -> None:
    objs = gitops(POOL, {"nlp": {"burstingPriority": 3}, "vision": {"burstingPriority": 2}})
    out = run_decide(
        tmp_path,
        objs,
        {"nodes": nodes("h100", 5), "workloads": _many("nlp", 10) + _many("vision", 1)},
    )
    got = admitted(out)
    assert sum(n.startswith("nlp") for n in got) == 4
    assert "vision-0" in got


def test_r3_shares_are_divided_down_the_tree(tmp_path: Path) -> None:
    teams: dict[str, dict[str, Any]] = {
        "research": {},
        "production": {},
        "nlp": {"parent": "research", "burstingPriority": 3},
        "vision": {"parent": "research", "burstingPriority": 2},
        "training": {"parent": "production"},
    }
    objs = gitops({"h100": {"maxGPUs": 80}}, teams)
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 10),
            "workloads": _many("nlp", 10) + _many("vision", 10) + _many("training", 10),
        },
    )
    got = admitted(out)
    counts = {t: sum(n.startswith(t) for n in got) for t in ("nlp", "vision", "training")}
    assert counts == {"nlp": 3, "vision": 2, "training": 5}


def test_r3_equal_priority_work_reclaims_beyond_fair_share(tmp_path: Path) -> None:
    objs = gitops(POOL, {"a": {}, "b": {}})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 4),
            "workloads": [
                running(f"a-{i}", "a", 8, [f"h100-{i}"], started=f"2026-01-01T0{i}:00:00Z")
                for i in range(1, 5)
            ]
            + _many("b", 3),
        },
    )
    assert set(admitted(out)) == {"b-0", "b-1"}  # b gets its half, no more
    victims = preempted(out)
    assert len(victims) == 2
    assert {p["reason"] for p in out["preempted"]} == {"FairShare"}
    # the most recently started of a's workloads go first (R5)
    assert set(victims) == {"a-4", "a-3"}
    assert pending(out)["b-2"]["reason"] == "PoolFull"


# --- R4 priority among elastic work ----------------------------------------------------------


def test_r4_lower_priority_never_displaces_higher(tmp_path: Path) -> None:
    objs = gitops(POOL, {"a": {}, "b": {}})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 1),
            "workloads": [
                running("high", "a", 8, ["h100-1"], priority=75),
                waiting("low", "b", 8, priority=25),
            ],
        },
    )
    assert preempted(out) == {}
    assert pending(out)["low"]["reason"] == "PoolFull"


def test_r4_policy_caps_a_teams_priority(tmp_path: Path) -> None:
    policy = {"admission": {"maxPriority": {"b": 50}}}
    objs = gitops(POOL, {"a": {}, "b": {}}, policy=policy)
    state = {
        "nodes": nodes("h100", 1),
        "workloads": [
            running("victim", "a", 8, ["h100-1"], priority=60),
            waiting("capped", "b", 8, priority=90),
        ],
    }
    out = run_decide(tmp_path / "capped", objs, state)
    assert preempted(out) == {}
    out = run_decide(tmp_path / "uncapped", gitops(POOL, {"a": {}, "b": {}}), state)
    assert preempted(out) == {"victim": "capped"}


# --- R5 cheapest victims first, no more than needed --------------------------------------


def _reserved_needs(gpus: int, pods: int = 1) -> dict[str, Any]:
    return waiting("owner", "owner", gpus, cls="reserved", pods=pods)


def _owner_gitops(node_count: int) -> list[dict[str, Any]]:
    return gitops(POOL, {"owner": {}, "other": {}}, {("owner", "h100"): 8 * node_count})


def test_r5_queued_before_running(tmp_path: Path) -> None:
    queued = running("queued", "other", 8, ["h100-1"], started="2026-01-01T11:59:00Z")
    queued["state"] = "Queued"
    out = run_decide(
        tmp_path,
        _owner_gitops(2),
        {
            "nodes": nodes("h100", 2),
            "workloads": [queued, running("old", "other", 8, ["h100-2"]), _reserved_needs(8)],
        },
    )
    assert preempted(out) == {"queued": "owner"}


def test_r5_lowest_priority_then_most_recently_started(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path / "prio",
        _owner_gitops(2),
        {
            "nodes": nodes("h100", 2),
            "workloads": [
                running("p10", "other", 8, ["h100-1"], priority=10),
                running("p50", "other", 8, ["h100-2"], priority=50),
                _reserved_needs(8),
            ],
        },
    )
    assert preempted(out) == {"p10": "owner"}
    out = run_decide(
        tmp_path / "recent",
        _owner_gitops(2),
        {
            "nodes": nodes("h100", 2),
            "workloads": [
                running("early", "other", 8, ["h100-1"], started="2026-01-01T06:00:00Z"),
                running("late", "other", 8, ["h100-2"], started="2026-01-01T09:00:00Z"),
                _reserved_needs(8),
            ],
        },
    )
    assert preempted(out) == {"late": "owner"}


def test_r5_no_more_than_needed(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        _owner_gitops(1),
        {
            "nodes": nodes("h100", 1),
            "workloads": [
                running("x", "other", 4, ["h100-1"], started="2026-01-01T09:00:00Z"),
                running("y", "other", 4, ["h100-1"], started="2026-01-01T10:00:00Z"),
                _reserved_needs(4),
            ],
        },
    )
    assert preempted(out) == {"y": "owner"}


def test_r5_victims_are_chosen_where_the_preemptor_really_fits(tmp_path: Path) -> None:
    objs = gitops(
        POOL,
        {"owner": {}, "other": {}, "keeper": {}},
        {("owner", "h100"): 8, ("keeper", "h100"): 8},
    )
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 3),
            "workloads": [
                running("k1", "keeper", 4, ["h100-1"], cls="reserved"),
                running("cheap-1", "other", 4, ["h100-1"], started="2026-01-01T11:00:00Z"),
                running("k2", "keeper", 4, ["h100-2"], cls="reserved"),
                running("cheap-2", "other", 4, ["h100-2"], started="2026-01-01T11:00:00Z"),
                running("dear", "other", 8, ["h100-3"], started="2026-01-01T06:00:00Z"),
                _reserved_needs(8),
            ],
        },
    )
    # the cheap victims are spread over nodes where 8 GPUs can never be free together
    assert preempted(out) == {"dear": "owner"}
    assert admitted(out) == {"owner": ["h100-3"]}


# --- R6 thrash guards -------------------------------------------------------------------------


def test_r6_young_elastic_work_yields_only_to_reserved(tmp_path: Path) -> None:
    young = running("young", "other", 8, ["h100-1"], started="2026-01-01T11:58:00Z")
    out = run_decide(
        tmp_path / "elastic",
        gitops(POOL, {"other": {}, "b": {}}),
        {"nodes": nodes("h100", 1), "workloads": [young, waiting("urgent", "b", 8, priority=90)]},
    )
    assert preempted(out) == {}
    out = run_decide(
        tmp_path / "reserved",
        _owner_gitops(1),
        {"nodes": nodes("h100", 1), "workloads": [young, _reserved_needs(8)]},
    )
    assert preempted(out) == {"young": "owner"}


def _backed_off(**extra: Any) -> dict[str, Any]:
    back = waiting(
        "back",
        "other",
        8,
        submitted="2026-01-01T10:00:00Z",
        preemptedAt="2026-01-01T11:58:00Z",
        preemptedFrom="h100",
        **extra,
    )
    back["state"] = "Preempted"
    return back


def test_r6_back_off_yields_the_capacity_to_other_waiting_work(tmp_path: Path) -> None:
    """While its preemptor holds the GPUs, a backed-off workload lets other work have the free
    ones, even work submitted after it, and does not take the GPUs back by preemption."""
    owner = running("owner", "owner", 8, ["h100-1"], cls="reserved")
    rival = waiting("rival", "third", 8, submitted="2026-01-01T11:00:00Z")
    objs = gitops(POOL, {"owner": {}, "other": {}, "third": {}}, {("owner", "h100"): 8})
    out = run_decide(
        tmp_path,
        objs,
        {"nodes": nodes("h100", 2), "workloads": [owner, rival, _backed_off(preemptedBy="owner")]},
    )
    assert admitted(out) == {"rival": ["h100-2"]}
    why = pending(out)["back"]
    assert why["reason"] == "BackOff"
    assert why["eta"] == "2026-01-01T12:08:00Z"  # preemptedAt + the default 10m back-off
    assert "by owner, which still holds the GPUs" in why["message"]
    assert "until the back-off of 10m ends or those GPUs are released" in why["message"]


def test_r6_back_off_never_leaves_gpus_idle(tmp_path: Path) -> None:
    """R7 wins: with nothing else waiting, a backed-off workload runs at once."""
    owner = running("owner", "owner", 8, ["h100-1"], cls="reserved")
    out = run_decide(
        tmp_path,
        _owner_gitops(1),
        {"nodes": nodes("h100", 2), "workloads": [owner, _backed_off(preemptedBy="owner")]},
    )
    assert admitted(out) == {"back": ["h100-2"]}


def test_r6_back_off_ends_when_the_preemptor_releases_the_gpus(tmp_path: Path) -> None:
    """Once its preemptor finished, a preempted workload competes as any other: it was
    submitted first, so it gets the one free node ahead of later work."""
    rival = waiting("rival", "third", 8, submitted="2026-01-01T11:00:00Z")
    objs = gitops(POOL, {"owner": {}, "other": {}, "third": {}}, {("owner", "h100"): 8})
    state = {"nodes": nodes("h100", 1), "workloads": [rival, _backed_off(preemptedBy="owner")]}
    out = run_decide(tmp_path / "released", objs, state)
    assert admitted(out) == {"back": ["h100-1"]}
    assert pending(out)["rival"]["reason"] == "PoolFull"
    # without a recorded preemptor (an older record) the time window alone decides
    state["workloads"] = [rival, _backed_off()]
    out = run_decide(tmp_path / "unknown", objs, state)
    assert admitted(out) == {"rival": ["h100-1"]}
    assert pending(out)["back"]["reason"] == "BackOff"


def test_r6_back_off_does_not_apply_inside_the_own_reservation(tmp_path: Path) -> None:
    owner = running("owner", "owner", 8, ["h100-1"], cls="reserved")
    rival = waiting("rival", "third", 8, submitted="2026-01-01T11:00:00Z")
    objs = gitops(
        POOL,
        {"owner": {}, "other": {}, "third": {}},
        {("owner", "h100"): 8, ("other", "h100"): 8},
    )
    out = run_decide(
        tmp_path,
        objs,
        {"nodes": nodes("h100", 2), "workloads": [owner, rival, _backed_off(preemptedBy="owner")]},
    )
    assert admitted(out) == {"back": ["h100-2"]}


# --- R7 work conservation ---------------------------------------------------------------------


def test_r7_smaller_work_runs_while_a_large_job_waits(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        gitops(POOL, {"a": {}}),
        {
            "nodes": nodes("h100", 1),
            "workloads": [
                running("half", "a", 4, ["h100-1"]),
                waiting("large", "a", 8, submitted="2026-01-01T10:00:00Z"),
                waiting("small", "a", 4),
            ],
        },
    )
    assert admitted(out) == {"small": ["h100-1"]}
    assert pending(out)["large"]["reason"] == "PoolFull"


# --- R8 placement -------------------------------------------------------------------------------


def test_r8_multi_gpu_pods_need_one_node(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        gitops(POOL, {"a": {}}),
        {
            "nodes": nodes("h100", 2),
            "workloads": [
                running("x", "a", 4, ["h100-1"]),
                running("y", "a", 4, ["h100-2"]),
                waiting("eight", "a", 8),
            ],
        },
    )
    why = pending(out)["eight"]
    assert why["reason"] == "NoFittingNode"
    assert "8 GPUs are free in pool h100 but no node has 8 free GPUs together" in why["message"]


def test_r8_gangs_are_all_or_nothing(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        gitops(POOL, {"a": {}}),
        {
            "nodes": nodes("h100", 4),
            "workloads": [
                running("x", "a", 4, ["h100-1"]),
                running("y", "a", 4, ["h100-2"]),
                waiting("gang", "a", 8, pods=3),
            ],
        },
    )
    assert admitted(out) == {}
    why = pending(out)["gang"]
    assert why["reason"] == "WaitingForGang"
    assert "only 2 of 3 pods" in why["message"]


def test_r8_best_fit_keeps_whole_nodes_free(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        gitops(POOL, {"a": {}}),
        {
            "nodes": nodes("h100", 3),
            "workloads": [running("x", "a", 4, ["h100-2"]), waiting("four", "a", 4)],
        },
    )
    assert admitted(out) == {"four": ["h100-2"]}


def test_r8_fractional_gpus_share_a_gpu(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        gitops(POOL, {"a": {}}),
        {
            "nodes": nodes("h100", 2),
            "workloads": [
                running("seven", "a", 7, ["h100-2"]),
                running("half", "a", 0.5, ["h100-2"]),
                waiting("quarter", "a", 0.25, submitted="2026-01-01T10:00:00Z"),
                waiting("another-quarter", "a", 0.25),
            ],
        },
    )
    # both quarters go on the GPU already shared on h100-2; h100-1 stays whole
    assert admitted(out) == {"quarter": ["h100-2"], "another-quarter": ["h100-2"]}


def test_r8_zone_and_gpu_type_and_health(tmp_path: Path) -> None:
    objs = gitops({**POOL, "a100": {"gpuType": "A100"}}, {"a": {}})
    state = {
        "nodes": [
            {"name": "n-a", "pool": "h100", "gpus": 8, "zone": "zone-a"},
            {"name": "n-b", "pool": "h100", "gpus": 8, "zone": "zone-b", "healthy": False},
            {"name": "n-c", "pool": "h100", "gpus": 8, "zone": "zone-c"},
        ],
        "workloads": [
            waiting("in-b", "a", 8, zone="zone-b"),
            waiting("a100", "a", 1, pool="h100", gpuTypes=["A100"]),
            waiting("gang", "a", 8, pods=2),
        ],
    }
    out = run_decide(tmp_path, objs, state)
    got = pending(out)
    assert got["in-b"]["reason"] == "NoHealthyNode"
    assert got["a100"]["reason"] == "NoMatchingPool"
    assert got["gang"]["reason"] == "WaitingForGang"  # one free node per zone: never split
    assert "n-b" not in str(out["admitted"])


# --- several acceptable GPU types, the most preferred first --------------------------------

TWO_TYPES: dict[str, dict[str, Any]] = {"h100": {}, "a100": {"gpuType": "A100"}}


def test_gpu_types_the_next_type_when_the_preferred_is_full(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        gitops(TWO_TYPES, {"a": {}, "b": {}}),
        {
            "nodes": nodes("h100", 1) + nodes("a100", 2),
            "workloads": [
                running("h100-user", "b", 8, ["h100-1"], priority=90),
                waiting("either", "a", 4, gpuTypes=["H100", "A100"]),
                waiting("either-too", "a", 4, gpuTypes=["H100", "A100"]),
            ],
        },
    )
    # best fit inside A100: both on one node, the other stays whole
    assert admitted(out) == {"either": ["a100-1"], "either-too": ["a100-1"]}
    assert preempted(out) == {}


def test_gpu_types_the_preferred_type_first_even_where_another_fits_tighter(
    tmp_path: Path,
) -> None:
    out = run_decide(
        tmp_path,
        gitops(TWO_TYPES, {"a": {}}),
        {
            "nodes": nodes("h100", 1) + nodes("a100", 1),
            "workloads": [
                running("on-a100", "a", 6, ["a100-1"]),
                waiting("prefers-h100", "a", 2, gpuTypes=["H100", "A100"]),
                waiting("prefers-a100", "a", 2, gpuTypes=["A100", "H100"]),
            ],
        },
    )
    assert admitted(out) == {"prefers-h100": ["h100-1"], "prefers-a100": ["a100-1"]}


def test_gpu_types_never_preempt_in_a_pool_not_listed(tmp_path: Path) -> None:
    objs = gitops({**TWO_TYPES, "l4": {"gpuType": "L4"}}, {"a": {}, "b": {}})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 1) + nodes("a100", 1) + nodes("l4", 1),
            "workloads": [
                running("cheap-h100", "b", 8, ["h100-1"], priority=10),
                running("busy-a100", "b", 8, ["a100-1"], priority=90),
                running("busy-l4", "b", 8, ["l4-1"], priority=90),
                waiting("urgent", "a", 8, priority=75, gpuTypes=["A100", "L4"]),
            ],
        },
    )
    assert admitted(out) == {} and preempted(out) == {}
    why = pending(out)["urgent"]
    assert why["reason"] == "PoolFull"
    assert why["message"].startswith("tried A100, L4 in that order: A100: needs 8 GPUs")
    assert "L4: needs 8 GPUs in pool l4; 0 are free" in why["message"]


def test_gpu_types_preempt_in_the_preferred_pool_first(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        gitops(TWO_TYPES, {"a": {}, "b": {}}),
        {
            "nodes": nodes("h100", 1) + nodes("a100", 1),
            "workloads": [
                running("cheap-h100", "b", 8, ["h100-1"], priority=10),
                running("cheap-a100", "b", 8, ["a100-1"], priority=10),
                waiting("urgent", "a", 8, priority=75, gpuTypes=["A100", "H100"]),
            ],
        },
    )
    assert admitted(out) == {"urgent": ["a100-1"]}
    assert preempted(out) == {"cheap-a100": "urgent"}


def test_gpu_types_reserved_work_uses_the_preferred_reservation(tmp_path: Path) -> None:
    objs = gitops(TWO_TYPES, {"a": {}}, {("a", "h100"): 8, ("a", "a100"): 16})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 1) + nodes("a100", 2),
            "workloads": [
                waiting("first", "a", 8, cls="reserved", gpuTypes=["H100", "A100"]),
                waiting("second", "a", 8, cls="reserved", gpuTypes=["H100", "A100"]),
                waiting("h100-only", "a", 8, cls="reserved", gpuTypes=["H100"]),
            ],
        },
    )
    # the H100 reservation is taken by the first; the second goes on to A100's; the third
    # accepts H100 alone and waits for that reservation
    assert admitted(out) == {"first": ["h100-1"], "second": ["a100-1"]}
    assert pending(out)["h100-only"]["reason"] == "ReservationExhausted"


def test_fractions_only_in_pools_that_share_gpus(tmp_path: Path) -> None:
    objs = gitops({"h100": {"sharing": "none"}, "a100": {"gpuType": "A100"}}, {"a": {}})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 1) + nodes("a100", 1),
            "workloads": [
                running("big", "a", 8, ["a100-1"]),
                waiting("quarter", "a", 0.25),  # any pool: only a100 shares, and it is full
                waiting("pinned", "a", 0.5, pool="h100"),
                waiting("whole", "a", 1),
            ],
        },
    )
    assert admitted(out) == {"whole": ["h100-1"]}
    assert pending(out)["quarter"]["reason"] == "PoolFull"
    why = pending(out)["pinned"]
    assert why["reason"] == "NoMatchingPool"
    assert why["message"].startswith("asks 0.5 GPU, a fraction, but pool h100 has sharing: none")


def test_gpu_types_a_type_no_pool_has_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "gitops.yaml").write_text(yaml.safe_dump_all(gitops(TWO_TYPES, {"a": {}})))
    state = {"time": "2026-01-01T12:00:00Z", "workloads": [waiting("x", "a", 1, gpuTypes=["H10"])]}
    (tmp_path / "state.yaml").write_text(yaml.safe_dump(state))
    result = CliRunner().invoke(
        app,
        [
            "decide",
            "--gitops",
            str(tmp_path / "gitops.yaml"),
            "--state",
            str(tmp_path / "state.yaml"),
        ],
    )
    assert result.exit_code != 0
    assert "no pool has GPU type 'H10'" in result.output and "H100" in result.output
    assert "Traceback" not in result.output


# --- R9 explainability ----------------------------------------------------------------------------


def test_r9_positions_and_eta(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        gitops(POOL, {"a": {}}, {("a", "h100"): 8}),
        {
            "nodes": nodes("h100", 1),
            "workloads": [
                running(
                    "busy", "a", 8, ["h100-1"], cls="reserved", expectedEnd="2026-01-01T14:00:00Z"
                ),
                waiting("second", "a", 8, submitted="2026-01-01T11:30:00Z"),
                waiting("first", "a", 8, submitted="2026-01-01T11:00:00Z"),
                waiting("urgent", "a", 8, priority=90, submitted="2026-01-01T11:45:00Z"),
            ],
        },
    )
    got = pending(out)
    assert [got[n]["position"] for n in ("urgent", "first", "second")] == [1, 2, 3]
    assert got["first"]["eta"] == "2026-01-01T14:00:00Z"
    assert got["first"]["reason"] == "PoolFull"


def test_r9_eta_unknown_without_expected_ends(tmp_path: Path) -> None:
    out = run_decide(
        tmp_path,
        gitops(POOL, {"a": {}}),
        {
            "nodes": nodes("h100", 1),
            "workloads": [running("busy", "a", 8, ["h100-1"]), waiting("w", "a", 8)],
        },
    )
    assert pending(out)["w"]["eta"] is None


def test_policy_limit(tmp_path: Path) -> None:
    objs = gitops(POOL, {"a": {}}, policy={"admission": {"maxGPUsPerWorkload": 16}})
    out = run_decide(
        tmp_path, objs, {"nodes": nodes("h100", 4), "workloads": [waiting("huge", "a", 8, pods=3)]}
    )
    why = pending(out)["huge"]
    assert why["reason"] == "PolicyLimit"
    assert "asks 24 GPUs; the FleetPolicy allows 16" in why["message"]


def test_r7_gpus_freed_by_a_larger_victim_go_to_waiting_work(tmp_path: Path) -> None:
    objs = gitops(POOL, {"ta": {"burstLimit": "8"}, "tb": {}})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 2),
            "workloads": [
                running("v", "ta", 8, ["h100-1"], priority=10),
                running("w", "tb", 8, ["h100-2"], priority=90),
                waiting("a", "ta", 4, priority=50),
                waiting("b", "tb", 4, priority=50),
            ],
        },
    )
    # a waits on ta's burst limit until b preempts v (ta's own low-priority work); the other
    # half of v's node must then go to a, not stay idle
    assert preempted(out) == {"v": "b"}
    assert admitted(out) == {"a": ["h100-1"], "b": ["h100-1"]}


def test_r2_own_reservation_busy_with_own_elastic_work_is_not_idle(tmp_path: Path) -> None:
    # nlp's 8 reserved GPUs in "small" are already taken by its own elastic work, so new
    # elastic work goes where GPUs are free instead of waiting on or preempting in "small"
    objs = gitops({"big": {}, "small": {}}, {"nlp": {}}, {("nlp", "small"): 8})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("big", 2) + nodes("small", 2),
            "workloads": [running("mine", "nlp", 8, ["small-1"]), waiting("job", "nlp", 8)],
        },
    )
    assert admitted(out) == {"job": ["big-1"]}


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def one_pool(
    nodes: tuple[Node, ...], workloads: tuple[Workload, ...], reserved: int = 0
) -> Snapshot:
    """An engine snapshot of pool `p` (8-GPU H100 nodes) and team `t` holding `reserved` GPUs
    of it: for node states the state file does not carry (health, schedulability)."""
    return Snapshot(
        NOW,
        {"p": PoolInfo("p", "H100", 8, 8 * len(nodes), autoscaling=False)},
        {"t": TeamInfo("t", None, 1, None)},
        {("t", "p"): reserved} if reserved else {},
        Policy(),
        nodes,
        workloads,
    )


def running_on(name: str, cls: WorkloadClass, gpus: float, on: tuple[str, ...]) -> Workload:
    return Workload(
        name,
        "t",
        cls,
        gpus,
        NOW,
        pods=len(on),
        state=WorkloadState.RUNNING,
        started_at=NOW,
        nodes=on,
    )


def test_work_on_an_unhealthy_node_is_requeued_without_back_off() -> None:
    """A quarantined node (healthy=False) loses its workloads, reserved or elastic; a gang with
    one pod there is requeued whole; the GPUs its other pods held are free again."""
    nodes = (Node("n-1", "p", 8), Node("n-2", "p", 8, healthy=False), Node("n-3", "p", 8))
    decisions = decide(
        one_pool(
            nodes,
            (
                running_on("gang", WorkloadClass.RESERVED, 8, ("n-1", "n-2")),
                running_on("fine", WorkloadClass.ELASTIC, 8, ("n-3",)),
            ),
            reserved=24,
        )
    )
    assert [(p.workload, p.reason) for p in decisions.preempted] == [
        ("gang", PreemptionReason.NODE_UNHEALTHY)
    ]
    assert "n-2" in decisions.preempted[0].message
    assert decisions.admitted == ()


def test_an_unschedulable_node_keeps_its_work_and_takes_no_new_work() -> None:
    """A cordoned node, or one NotReady for less than the grace period (schedulable=False but
    healthy), keeps what runs there; new work goes elsewhere or waits."""
    nodes = (Node("n-1", "p", 8, schedulable=False), Node("n-2", "p", 8))
    on_n1 = running_on("run", WorkloadClass.ELASTIC, 4, ("n-1",))
    waiting = [Workload(f"w{i}", "t", WorkloadClass.ELASTIC, 4, NOW) for i in range(3)]
    decisions = decide(one_pool(nodes, (on_n1, *waiting)))
    assert decisions.preempted == ()
    assert {a.workload: a.nodes for a in decisions.admitted} == {"w0": ("n-2",), "w1": ("n-2",)}
    assert [w.workload for w in decisions.pending] == ["w2"]


def test_lemon_nodes_take_elastic_work_first_and_critical_work_last() -> None:
    """A node with recent faults is placed first for single-pod elastic work and last for
    reserved work and gangs, which still use it when nothing else fits."""
    nodes = (Node("n-1", "p", 8, faults=1.0), Node("n-2", "p", 8), Node("n-3", "p", 8))

    def waiting(name: str, cls: WorkloadClass, gpus: float, pods: int = 1) -> Workload:
        return Workload(name, "t", cls, gpus, NOW, pods=pods)

    elastic = waiting("small", WorkloadClass.ELASTIC, 2)
    reserved = waiting("train", WorkloadClass.RESERVED, 2)
    gang = waiting("gang", WorkloadClass.ELASTIC, 8, pods=2)
    for workload, expected in (
        (elastic, ("n-1",)),
        (reserved, ("n-2",)),
        (gang, ("n-2", "n-3")),
    ):
        (admitted,) = decide(one_pool(nodes, (workload,), reserved=16)).admitted
        assert admitted.nodes == expected, workload.name
    # best fit among the reliable nodes, before any lemon: the partly used n-3
    busy = running_on("busy", WorkloadClass.ELASTIC, 4, ("n-3",))
    (admitted,) = decide(one_pool(nodes, (busy, reserved), reserved=16)).admitted
    assert admitted.nodes == ("n-3",)
    # nothing else fits: the lemon still takes critical work
    full = tuple(running_on(f"f{i}", WorkloadClass.ELASTIC, 8, (n,)) for i, n in
                 enumerate(("n-2", "n-3")))  # fmt: skip
    (admitted,) = decide(one_pool(nodes, (*full, reserved), reserved=16)).admitted
    assert admitted.nodes == ("n-1",)
    assert not Node("n", "p", 8, faults=0.4).lemon and Node("n", "p", 8, faults=0.5).lemon


def test_r1_reserved_work_on_free_gpus_joins_reserved_work(tmp_path: Path) -> None:
    """On free GPUs too, reserved pods go where reserved work already is (not best fit), so
    the other node stays one that evicting elastic work can empty."""
    objs = gitops({"h100": {"maxGPUs": 16}}, {"a": {}, "b": {}}, {("a", "h100"): 8})
    out = run_decide(
        tmp_path,
        objs,
        {
            "nodes": nodes("h100", 2),
            "workloads": [
                running("serve", "a", 2, ["h100-1"], cls="reserved"),
                running("sweep", "b", 5, ["h100-2"]),
                waiting("eval", "a", 2, cls="reserved"),
            ],
        },
    )
    assert admitted(out) == {"eval": ["h100-1"]}  # best fit alone would pick h100-2 (3 free)
