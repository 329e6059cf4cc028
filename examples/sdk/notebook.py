"""A notebook-style tour of the gpufleet Python SDK: run it cell by cell in Jupyter (each `# %%`
is a cell) or as a script.

    gpufleet server --kubeconfig ~/.cache/gpufleet/dev-cluster/kubeconfig --insecure-local &
    python examples/sdk/notebook.py                      # no token needed in insecure-local mode

Against a real cluster, point GPUFLEET_URL at the server (e.g. after `kubectl port-forward -n
gpufleet-system svc/gpufleet-server 8090:80`) and give a token (GPUFLEET_TOKEN, e.g. from
`kubectl create token NAME -n NAMESPACE`): what you see is what that identity may see.
"""

# %%
import os

from gpufleet.client import ApiError, Client

fleet = Client(
    os.environ.get("GPUFLEET_URL", "http://127.0.0.1:8090"), token=os.environ.get("GPUFLEET_TOKEN")
)
print("signed in as", fleet.whoami().user)

# %% Where are GPUs idle, and what does that cost per hour?
capacity = fleet.capacity()
for unused in capacity.unused_by_type:
    cost = f"${unused.idle_cost_per_hour:,.2f}/h" if unused.idle_cost_per_hour is not None else "?"
    print(f"{unused.gpu_type:>24}: {unused.idle_gpus:g} of {unused.healthy_gpus} idle, {cost}")

# %% Teams against their reservations
for team in fleet.teams():
    ceiling = "no limit" if team.burst_ceiling_gpus is None else f"{team.burst_ceiling_gpus:g}"
    print(f"{team.name:>12}: uses {team.used_gpus:g} of {team.reserved_gpus:g} reserved "
          f"(ceiling {ceiling}), {team.waiting} waiting")  # fmt: skip

# %% The queue: why is each workload waiting, and when may it start?
for w in fleet.workloads(state="Pending,Preempted").items:
    print(f"{w.namespace}/{w.name}: {w.reason} (#{w.position} of team {w.team}), eta {w.eta}")
    print("   ", fleet.explain(w.namespace, w.name).text)

# %% Answers are typed (pydantic models): a list of workloads becomes a table in one line
rows = [w.model_dump(by_alias=True) for w in fleet.workloads(since="48h").items]
print(f"{len(rows)} workloads in the last 48 hours")

# %% What you may not do is an ApiError that names the missing permission
try:
    fleet.cancel("some-namespace", "not-yours")
except ApiError as err:
    print(err.status, err.message, err.missing or "")
