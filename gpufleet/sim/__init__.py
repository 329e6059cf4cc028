"""The simulator: replay a workload trace through the engine (DESIGN §2)."""
