"""The usage ledger: every run segment of every workload and every pool's capacity over time,
in SQLite or PostgreSQL, written from lifecycle events by the controller and the simulator
alike, and read by `gpufleet cost` and `gpufleet usage` (see docs/cost.md)."""
