"""gpufleet.agent: the per-node NVML health and metrics agent.

Not built yet (see the node-agent issue); the package exists so the import name is reserved.
"""
