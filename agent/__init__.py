"""gpufleet.agent: the per-node GPU health and metrics agent (a DaemonSet on GPU nodes).

`backend.py` is the NVML interface, `nvml.py` the real one (nvidia-ml-py), `fake.py` a scripted
timeline for tests and demos; `publish.py` writes the node condition, Events and metrics;
`runner.py` runs the two loops. The checks themselves are in `gpufleet.health`.
"""
