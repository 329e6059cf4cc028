"""The Kubernetes adapter layer: what every shell (controllers, API server, CLI, diagnosis)
knows of Kubernetes objects, and nothing of what any one of them does with it.

- `kinds/`: one adapter per workload kind (pod sets, suspend/resume or scheduling gate,
  outcome) and the registry `KINDS` that drives everything done per kind;
- `cache.py`: watch-fed caches, the only way a reader sees the cluster;
- `request.py`: what a workload asks for (team, class, priority, pool, GPUs) from its labels;
- `observe.py`: pure observation helpers (node health, GPUs by node, discovered pools, the
  state of a workload) and the engine snapshot made from them;
- `client.py`: the few API calls more than one shell makes.

Layers: model → engine / render / health → kube → shells. Nothing here imports a shell.
"""
