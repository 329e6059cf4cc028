"""May this action be taken for this diagnosis and team, and does it need an approval? Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.model.api import REMEDIATION_TIERS, RemediationPolicy


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    tier: int
    needs_approval: bool
    reason: str


def judge(policies: Iterable[RemediationPolicy], action: str, pattern: str, team: str) -> Verdict:
    """Deny by default: allowed only when a rule names the action for the pattern and team.
    Tier 2 needs an approval unless a matching rule pre-approves it; tier 3 is never applied,
    only written up (it needs no approval to be written up)."""
    tier = REMEDIATION_TIERS.get(action)
    if tier is None:
        known = ", ".join(REMEDIATION_TIERS)
        return Verdict(False, -1, False, f"unknown action {action!r} (actions: {known})")
    matching = [
        rule
        for policy in policies
        for rule in policy.spec.rules
        if rule.action == action
        and ("*" in rule.patterns or pattern in rule.patterns)
        and ("*" in rule.teams or team in rule.teams)
    ]
    if not matching:
        return Verdict(
            False,
            tier,
            False,
            f"no rule of the remediation policy allows {action} for diagnosis {pattern} of "
            f"team {team} (deny by default; add a rule by pull request)",
        )
    needs = tier == 2 and not any(rule.pre_approved for rule in matching)
    why = "allowed by the remediation policy"
    if needs:
        why += "; tier 2: needs an approval (gpufleet ops approve ID)"
    return Verdict(True, tier, needs, why)
