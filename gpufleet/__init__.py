"""gpufleet: a GitOps-driven GPU capacity control plane for Kubernetes."""

__version__ = "0.1.0"
