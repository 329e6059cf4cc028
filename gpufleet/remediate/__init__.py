"""Remediation of failed work under a deny-by-default policy, with approvals for risky actions
and an append-only audit log (see docs/diagnosis.md)."""
