"""Test support: a local Kubernetes control plane with simulated GPU nodes."""
