"""A JAX-layout project: pyproject.toml, main.py, its settings in .gpufleet.yaml."""

import sys

import jax

print(f"main.py ran: jax {jax.__version__}, args={sys.argv[1:]}")
