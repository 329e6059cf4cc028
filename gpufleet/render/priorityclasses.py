"""The PriorityClasses of DESIGN §3.

Reserved work maps to a class at or above KAI Scheduler's non-preemptible threshold (100);
elastic work to preemptible classes below it, one per named priority. Every class has
`preemptionPolicy: Never`: preemption is decided once, by the gpufleet engine, and carried out by
suspending workloads, so kube-scheduler must never evict pods on its own.
"""

from __future__ import annotations

from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.render.common import Manifest, managed_labels

PRIORITY_CLASS_API = "scheduling.k8s.io/v1"
NON_PREEMPTIBLE_THRESHOLD = 100
RESERVED_PRIORITY = NON_PREEMPTIBLE_THRESHOLD
RESERVED_CLASS = "gpufleet-reserved"


def elastic_class_name(priority_name: str) -> str:
    return f"gpufleet-elastic-{priority_name}"


def priority_value(class_name: str) -> int:
    """The value of one of gpufleet's PriorityClasses."""
    if class_name == RESERVED_CLASS:
        return RESERVED_PRIORITY
    return NAMED_PRIORITIES[class_name.removeprefix(elastic_class_name(""))]


def _priority_class(name: str, value: int, description: str) -> Manifest:
    return {
        "apiVersion": PRIORITY_CLASS_API,
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": managed_labels()},
        "value": value,
        "globalDefault": False,
        "preemptionPolicy": "Never",
        "description": description,
    }


def render_priority_classes() -> list[Manifest]:
    out = [
        _priority_class(
            RESERVED_CLASS,
            RESERVED_PRIORITY,
            "gpufleet reserved work: runs within its team's reservation and is never preempted.",
        )
    ]
    for name, value in sorted(NAMED_PRIORITIES.items(), key=lambda item: -item[1]):
        out.append(
            _priority_class(
                elastic_class_name(name),
                value,
                f"gpufleet elastic work, priority {name} ({value}): uses idle GPUs and may be "
                "preempted when their owner needs them back.",
            )
        )
    return out
