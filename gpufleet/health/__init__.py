"""GPU health: the checks the node agent runs and the quarantine decisions of the health
controller. Pure Python: no NVML, no Kubernetes (the agent and controller are the shells)."""
