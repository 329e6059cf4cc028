"""The MutatingAdmissionPolicies that hold a new GPU Job, Deployment, LeaderWorkerSet or bare pod
for admission inside the API server, in place of the webhook: gpufleet's scheduling gate in its
pod templates (its pods are made at once and wait at the gate; kinds/job.py, kinds/gated.py)
or, for a bare pod, in the pod itself, marked as gpufleet's, its team and class labelled and
each pod template given what the webhook's `creation_patch` gives it (PriorityClass, GPU
toleration, scheduler, KAI queue, a gang's zone affinity; a Deployment's, a LeaderWorkerSet's
and a named bare pod's, the workload label they are found by; a bare pod's, the priority of its
class, which the API server has already resolved from the class it came with). One policy per
kind (`HOLDING`), so that each is typed against its own kind's schema. Pure: the shells apply
what these functions make.

Why: a webhook on the create path cost every create a round trip to the controller, and with
`failurePolicy: Fail` a controller restart blocked every tenant's creates. The policy is CEL
evaluated in the API server: no round trip, and it holds work whether or not the controller is
up. It reads the fleet from the same params ConfigMap as the tenancy policy (`policies.py`).

What CEL cannot vouch for it hands on: a workload whose team or pool the params do not know (a
Team created a moment ago), or whose labels or GPUs would be refused, is held as well and
annotated `gpufleet.io/check`; only such workloads reach the webhook, which refuses them with the
reason (or lets them through once its caches know the Team). When the webhook is down they stay
held, and the controller records why they cannot be admitted (an Event `Refused`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.model.keys import (
    ADMISSION_GATE,
    CLASS_LABEL,
    GPU_RESOURCE,
    GPU_TYPES_ANNOTATION,
    MANAGED_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    POOL_LABEL,
    PRIORITY_LABEL,
    SUBMITTER_ANNOTATION,
    TEAM_LABEL,
    TOPOLOGY_LABEL,
    WORKLOAD_LABEL,
    ZONE_LABEL,
)
from gpufleet.render.priorityclasses import RESERVED_CLASS, elastic_class_name, priority_value

from .kinds import DEPLOYMENT, JOB, KINDS, LEADER_WORKER_SET, POD
from .kinds.base import WorkloadKind
from .kinds.job import JOB_NAME_LABEL
from .policies import API, PARAMS, POLICY, admission_policies
from .request import KAI_QUEUE_LABEL, KAI_SCHEDULER

# on a workload the policy could not vouch for: the webhook checks it (and takes the mark off)
CHECK_ANNOTATION = "gpufleet.io/check"
# the Job controller labels each pod with its Job's uid: a gang's pod affinity keys on it, as
# the Job's name is not known yet when it is created with generateName
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
# the Deployment controller labels each pod with its ReplicaSet's template hash
TEMPLATE_HASH_LABEL = "pod-template-hash"
# the LeaderWorkerSet controller labels each of its pods with its name
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
# CEL: a pod no controller owns (the webhooks' registrations say the same)
BARE_POD = (
    "!has(object.metadata.ownerReferences) || "
    "!object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller)"
)


def cel(value: Any, type_path: str = "") -> str:
    """`value` as a CEL literal; objects typed by `type_path` (`Object.spec...`), as CEL wants
    the fields of the object it patches (an untyped map must hold one type of value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(cel(v, type_path) for v in value) + "]"
    if not type_path:  # a map
        return "{" + ", ".join(f"{cel(k)}: {cel(v)}" for k, v in value.items()) + "}"
    fields = ", ".join(f"{k}: {cel(v, f'{type_path}.{k}')}" for k, v in value.items())
    return f"{type_path}{{{fields}}}"


@dataclass(frozen=True)
class PodTemplate:
    """Where a held kind keeps one of its pod templates."""

    cel: str  # CEL: the template
    pointer: str  # JSON pointer: the template
    schema: str  # the template's type, for typed CEL values
    optional: bool = False  # there only where the object has it (a leaderTemplate)

    @property
    def spec(self) -> str:
        return f"{self.cel}.spec"

    def where(self, patches: str) -> str:
        """CEL: `patches` where this template is there."""
        return f"(has({self.cel}) ? {patches} : [])" if self.optional else patches

    def there(self, condition: str) -> str:
        """CEL: this template is there and `condition` holds of it."""
        return f"(has({self.cel}) && {condition})" if self.optional else condition


SPEC_TEMPLATE = PodTemplate("object.spec.template", "/spec/template", "Object.spec.template")
LWS_TEMPLATE = "spec.leaderWorkerTemplate"


def _lws_template(name: str, optional: bool = False) -> PodTemplate:
    path = f"{LWS_TEMPLATE}.{name}"
    return PodTemplate(f"object.{path}", "/" + path.replace(".", "/"), f"Object.{path}", optional)


@dataclass(frozen=True)
class HeldKind:
    """A kind the API server holds with a policy of its own, and what differs between them:
    where its pod templates are (a Job's and a Deployment's at `spec.template`, a
    LeaderWorkerSet's two under `spec.leaderWorkerTemplate`, a bare pod is its own), which of
    its objects are held, and what else its templates get."""

    kind: WorkloadKind
    policy: str  # the policy's name; the chart's carry the release's name before it
    pods: str  # CEL: how many of its pods run together (a gang when more than one)
    # the pod affinity term that keeps a gang's pods in one zone: `matchLabelKeys` narrows it
    # to the workload's own pods, its selector (of another key, as the API requires) to any
    gang_term: dict[str, Any]
    template_labels: dict[str, str] = field(default_factory=dict)  # CEL values
    vouched: str = "true"  # CEL: what else the policy must see to vouch for one
    templates: tuple[PodTemplate, ...] = (SPEC_TEMPLATE,)
    # (name, CEL) beside "it asks for GPUs": which of its objects are held
    conditions: tuple[tuple[str, str], ...] = ()
    # a bare pod: the API server resolved its priority from the class it came with before the
    # policy runs, so the policy sets the priority of the class it gives it
    bare: bool = False


def _pods_of_job() -> str:
    """CEL: the pods of a Job that run together, as job.pod_count counts them."""
    parallelism = "(has(object.spec.parallelism) ? object.spec.parallelism : 1)"
    return (
        f"has(object.spec.completions) && object.spec.completions < {parallelism}"
        " ? (object.spec.completions < 1 ? 1 : object.spec.completions)"
        f" : ({parallelism} < 1 ? 1 : {parallelism})"
    )


def _made_by_managed_kind() -> str:
    """CEL: a kind gpufleet manages made this Job (a JobSet's): its owner is admitted."""
    owners = ", ".join(cel(f"{k.group}/{k.kind}") for k in KINDS)
    return (
        "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, "
        "has(r.controller) && r.controller && "
        f"((r.apiVersion.contains('/') ? r.apiVersion.split('/')[0] : '') + '/' + r.kind)"
        f" in [{owners}])"
    )


# one a managed kind made (a JobSet's Job) is its owner's, admitted with it
NOT_MADE_BY_MANAGED_KIND = (("own", f"!({_made_by_managed_kind()})"),)
JOB_GANG_TERM = {
    "labelSelector": {"matchExpressions": [{"key": JOB_NAME_LABEL, "operator": "Exists"}]},
    "matchLabelKeys": [JOB_UID_LABEL],
    "topologyKey": ZONE_LABEL,
}
HOLDING: tuple[HeldKind, ...] = (
    HeldKind(
        JOB, "hold.gpufleet.io", _pods_of_job(), JOB_GANG_TERM, conditions=NOT_MADE_BY_MANAGED_KIND
    ),
    HeldKind(
        DEPLOYMENT,
        "hold-deployments.gpufleet.io",
        "has(object.spec.replicas) ? object.spec.replicas : 1",
        {
            "labelSelector": {
                "matchExpressions": [{"key": TEMPLATE_HASH_LABEL, "operator": "Exists"}]
            },
            "matchLabelKeys": [WORKLOAD_LABEL],
            "topologyKey": ZONE_LABEL,
        },
        # its pods are found by their workload's name: known at its create, or it cannot be
        # managed (generateName: the webhook refuses it)
        {WORKLOAD_LABEL: "'deployment-' + object.metadata.name"},
        "has(object.metadata.name) && object.metadata.name != ''",
        conditions=NOT_MADE_BY_MANAGED_KIND,
    ),
    # a LeaderWorkerSet: `replicas` groups of `size` pods, one gang; two templates, the
    # leader's only where it has one of its own. Its pods are found, and a gang's pod
    # affinity keys, on the workload label, as a Deployment's
    HeldKind(
        LEADER_WORKER_SET,
        "hold-leaderworkersets.gpufleet.io",
        "(has(object.spec.replicas) ? object.spec.replicas : 1) * "
        f"(has(object.{LWS_TEMPLATE}.size) ? object.{LWS_TEMPLATE}.size : 1)",
        {
            "labelSelector": {"matchExpressions": [{"key": LWS_NAME_LABEL, "operator": "Exists"}]},
            "matchLabelKeys": [WORKLOAD_LABEL],
            "topologyKey": ZONE_LABEL,
        },
        {WORKLOAD_LABEL: f"{cel(LEADER_WORKER_SET.workload_name(''))} + object.metadata.name"},
        "has(object.metadata.name) && object.metadata.name != ''",
        templates=(_lws_template("leaderTemplate", optional=True), _lws_template("workerTemplate")),
        conditions=NOT_MADE_BY_MANAGED_KIND,
    ),
    # a bare pod of a team: a workload of its own, one pod. Pods some controller owns are
    # their owner's; a pod gpufleet made again after a preemption comes held and labelled
    HeldKind(
        POD,
        "hold-pods.gpufleet.io",
        "1",
        JOB_GANG_TERM,  # never used: one pod is no gang
        templates=(PodTemplate("object", "", "Object"),),
        conditions=(
            ("bare", BARE_POD),
            ("team", f"has(object.metadata.labels) && '{TEAM_LABEL}' in object.metadata.labels"),
            ("unlabelled", f"!('{WORKLOAD_LABEL}' in object.metadata.labels)"),
        ),
        bare=True,
    ),
)
# the kinds the API server holds (the webhook holds the others)
HELD_KINDS: tuple[WorkloadKind, ...] = tuple(held.kind for held in HOLDING)
# never held: the cluster's own namespaces (the release's is added)
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


def closest_priority_name(priority: int) -> str:
    """The named priority nearest `priority` (the higher one on a tie), as request.py does."""
    return min(
        NAMED_PRIORITIES,
        key=lambda n: (abs(NAMED_PRIORITIES[n] - priority), -NAMED_PRIORITIES[n]),
    )


def elastic_classes() -> dict[str, str]:
    """The PriorityClass of elastic work for each value the priority label may take."""
    classes = {name: elastic_class_name(name) for name in NAMED_PRIORITIES}
    classes.update({str(p): elastic_class_name(closest_priority_name(p)) for p in range(100)})
    return classes


def pointer_key(key: str) -> str:
    """`key` as one step of a JSON pointer (RFC 6901): `/` in a label key is `~1`."""
    return key.replace("~", "~0").replace("/", "~1")


def _patch(path: str, value: str) -> str:
    return f"JSONPatch{{op: 'add', path: {path}, value: {value}}}"


def _key(key: str) -> str:
    return f"jsonpatch.escapeKey('{key}')"


def _map_entries(obj: str, field: str, pointer: str, entries: dict[str, str]) -> str:
    """CEL: the patches that set string `entries` (key: CEL value) in the map `obj.field`,
    whether the map exists or not."""
    whole = "{" + ", ".join(f"'{k}': {v}" for k, v in entries.items()) + "}"
    each = ", ".join(_patch(f"'{pointer}/' + {_key(k)}", v) for k, v in entries.items())
    return f"(has({obj}.{field}) ? [{each}] : [{_patch(repr(pointer), whole)}])"


def _template_labels(template: PodTemplate, entries: dict[str, str]) -> str:
    """CEL: the patches that set `entries` in a pod template's labels, whether its metadata
    and labels exist or not (a bare pod's always do: it carries the team label)."""
    if not entries:
        return "[]"
    metadata = f"{template.cel}.metadata"
    labels = _map_entries(metadata, "labels", f"{template.pointer}/metadata/labels", entries)
    if not template.pointer:
        return labels
    whole = "{" + ", ".join(f"'{k}': {v}" for k, v in entries.items()) + "}"
    made = f"{template.schema}.metadata{{labels: {whole}}}"
    return f"(has({metadata}) ? {labels} : [{_patch(repr(f'{template.pointer}/metadata'), made)}])"


def _gpu_values(held: HeldKind) -> str:
    """CEL: the GPU count of each container that asks for GPUs (its limit, else its request),
    as template_gpus reads them, of each of its templates (for the limit on a workload's GPUs,
    an overestimate where a LeaderWorkerSet's leader differs from its workers: such a one is
    handed to the webhook, which counts exactly)."""
    limits, requests = (
        f"has(c.resources) && has(c.resources.{m}) && '{GPU_RESOURCE}' in c.resources.{m}"
        for m in ("limits", "requests")
    )
    return " + ".join(
        template.where(
            f"{template.spec}.containers.filter(c, ({limits}) || ({requests}))"
            f".map(c, quantity(({limits}) ? c.resources.limits['{GPU_RESOURCE}']"
            f" : c.resources.requests['{GPU_RESOURCE}']))"
        )
        for template in held.templates
    )


def _variables(held: HeldKind) -> list[dict[str, str]]:
    def label(key: str, default: str) -> str:
        return f"'{key}' in variables.labels ? variables.labels['{key}'] : '{default}'"

    team_of_namespace = "'ns.' + request.namespace"
    return [
        {"name": "data", "expression": "has(params.data) ? params.data : {'': ''}"},
        {
            "name": "labels",
            "expression": "has(object.metadata.labels) ? object.metadata.labels : {'': ''}",
        },
        {
            "name": "team",
            "expression": f"'{TEAM_LABEL}' in variables.labels ? variables.labels['{TEAM_LABEL}']"
            f" : ({team_of_namespace}) in variables.data"
            f" ? variables.data[{team_of_namespace}] : ''",
        },
        {"name": "cls", "expression": label(CLASS_LABEL, "elastic")},
        {"name": "priority", "expression": label(PRIORITY_LABEL, "normal")},
        {"name": "gpus", "expression": _gpu_values(held)},
        {
            "name": "whole",
            "expression": "variables.gpus.all(q, q.isInteger())",
        },
        {"name": "pods", "expression": held.pods},
        {
            "name": "ours",
            "expression": "variables.gpus.exists(q, q.isGreaterThan(quantity('0')))"
            " && !(request.namespace in variables.data[?'excluded'].orValue('').split(','))"
            " && (variables.team != '' || variables.data[?'requireTeam'].orValue('') == 'true')",
        },
        {
            "name": "priorityClass",
            "expression": f"variables.cls == 'reserved' ? '{RESERVED_CLASS}' : "
            f"{cel(elastic_classes())}[?variables.priority].orValue('')",
        },
        {
            "name": "vouched",
            "expression": f"{held.vouched} && variables.team != ''"
            " && ('team.' + variables.team) in variables.data"
            " && variables.cls in ['reserved', 'elastic'] && variables.priorityClass != ''"
            " && variables.whole"
            " && (variables.data[?'maxGPUs'].orValue('') == '' || "
            "variables.gpus.map(q, q.asInteger()).sum() * variables.pods"
            " <= int(variables.data['maxGPUs']))"
            f" && (!('{POOL_LABEL}' in variables.labels) || variables.labels['{POOL_LABEL}'] in "
            "variables.data[?'pools'].orValue('').split(','))"
            f" && (!('{TOPOLOGY_LABEL}' in variables.labels) || "
            f"variables.labels['{TOPOLOGY_LABEL}'] in ['block', 'clique'])"
            # the GPU types it accepts are checked against the pools' by the webhook
            f" && !(has(object.metadata.annotations) && "
            f"'{GPU_TYPES_ANNOTATION}' in object.metadata.annotations)",
        },
        {"name": "scheduler", "expression": "variables.data[?'scheduler'].orValue('')"},
        {
            "name": "queue",
            "expression": "variables.data[?('queue.' + variables.team)].orValue('')",
        },
        {"name": "gang", "expression": "variables.pods > 1"},
    ]


def _mutation(held: HeldKind) -> str:
    """CEL: the JSON patch of a held workload (each op sets a value, so applying it twice is
    once)."""
    workload_label = cel("/metadata/labels/" + pointer_key(WORKLOAD_LABEL))
    workload_name = f"{cel(held.kind.workload_name(''))} + object.metadata.name"
    annotations = {MANAGED_ANNOTATION: "'true'", SUBMITTER_ANNOTATION: "request.userInfo.username"}
    labels = {TEAM_LABEL: "variables.team", CLASS_LABEL: "variables.cls"}
    parts = [
        "!variables.ours ? [] : ",
        _map_entries("object.metadata", "annotations", "/metadata/annotations", annotations),
        # the map exists by now: the op before made it where it was missing
        " + (variables.vouched ? [] : "
        f"[{_patch(cel('/metadata/annotations/' + pointer_key(CHECK_ANNOTATION)), cel('true'))}])",
        " + (variables.team == '' ? [] : "
        + _map_entries("object.metadata", "labels", "/metadata/labels", labels)
        + ")",
        # a named bare pod: the label its workload is found by (one made with generateName
        # has no name yet, as for the webhook)
        ""
        if not held.bare
        else " + (has(object.metadata.name) && object.metadata.name != '' ? "
        f"[{_patch(workload_label, workload_name)}]"
        " : [])",
        *(
            " + " + template.where(_template_mutation(held, template))
            for template in held.templates
        ),
    ]
    return "".join(parts)


def _template_mutation(held: HeldKind, template: PodTemplate) -> str:
    """CEL: the patches of one pod template of a held workload."""
    pod_spec, spec_pointer = template.spec, f"{template.pointer}/spec"
    class_priority = f"{cel(_priority_values())}[variables.priorityClass]"
    toleration = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    tolerations = f"{pod_spec}.tolerations"
    typed_toleration = cel(toleration, f"{template.schema}.spec.tolerations")
    typed_gate = cel({"name": ADMISSION_GATE}, f"{template.schema}.spec.schedulingGates")
    affinity = f"{pod_spec}.affinity"
    affinity_type = f"{template.schema}.spec.affinity"
    pod_affinity = cel(
        {"requiredDuringSchedulingIgnoredDuringExecution": [held.gang_term]},
        f"{affinity_type}.podAffinity",
    )
    whole_affinity = f"{affinity_type}{{podAffinity: {pod_affinity}}}"
    # its labels in one op where the map is missing: two would each make it anew
    queued = {**held.template_labels, KAI_QUEUE_LABEL: "variables.queue"}
    parts = [
        f"(!has({pod_spec}.schedulingGates) ? "
        f"[{_patch(repr(f'{spec_pointer}/schedulingGates'), f'[{typed_gate}]')}] : "
        f"{pod_spec}.schedulingGates.exists(g, g.name == '{ADMISSION_GATE}') ? [] : "
        f"[{_patch(repr(f'{spec_pointer}/schedulingGates/-'), typed_gate)}])",
        " + (variables.priorityClass == '' ? [] : "
        f"[{_patch(repr(f'{spec_pointer}/priorityClassName'), 'variables.priorityClass')}"
        + (
            # the API server resolved the priority of the class it came with: the class's own,
            # never preempting (the webhook's creation_patch says the same)
            f", {_patch(repr(f'{spec_pointer}/priority'), class_priority)}"
            f", {_patch(repr(f'{spec_pointer}/preemptionPolicy'), cel('Never'))}"
            if held.bare
            else ""
        )
        + "])",
        f" + (has({tolerations}) && {tolerations}.exists(t, has(t.key) && t.key == "
        f"'{GPU_RESOURCE}') ? [] : has({tolerations}) ? "
        f"[{_patch(repr(f'{spec_pointer}/tolerations/-'), typed_toleration)}] : "
        f"[{_patch(repr(f'{spec_pointer}/tolerations'), f'[{typed_toleration}]')}])",
        f" + (variables.scheduler == '{KAI_SCHEDULER}' && variables.queue != '' ? "
        + _template_labels(template, queued)
        + " : "
        + _template_labels(template, held.template_labels)
        + ")",
        " + (variables.scheduler == '' ? [] : "
        f"[{_patch(repr(f'{spec_pointer}/schedulerName'), 'variables.scheduler')}])",
        f" + (!variables.gang || (has({affinity}) && has({affinity}.podAffinity)) ? [] : "
        f"has({affinity}) ? "
        f"[{_patch(repr(f'{spec_pointer}/affinity/podAffinity'), pod_affinity)}] : "
        f"[{_patch(repr(f'{spec_pointer}/affinity'), whole_affinity)}])",
    ]
    return "(" + "".join(parts) + ")"


def _priority_values() -> dict[str, int]:
    """The value of each PriorityClass the policy may give (a bare pod gets it with its class)."""
    return {
        name: priority_value(name) for name in sorted({RESERVED_CLASS, *elastic_classes().values()})
    }


def holding_policy(held: HeldKind = HOLDING[0], name: str = "") -> dict[str, Any]:
    """The policy that holds new GPU workloads of `held.kind`, named `name` (else its own)."""
    asks_gpus = (
        f"has(c.resources) && ((has(c.resources.limits) && '{GPU_RESOURCE}' in c.resources.limits)"
        f" || (has(c.resources.requests) && '{GPU_RESOURCE}' in c.resources.requests))"
    )
    has_gpus = " || ".join(
        t.there(f"{t.spec}.containers.exists(c, {asks_gpus})") for t in held.templates
    )
    return {
        "apiVersion": API,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name or held.policy, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {
            # an error holds nothing back silently: the create fails with it
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [held.kind.group],
                        "apiVersions": [held.kind.version],
                        "resources": [held.kind.plural],
                        "operations": ["CREATE"],
                    }
                ]
            },
            # one without GPUs, or one not held (a managed kind made it, a controller owns the
            # pod), never evaluates a line more
            "matchConditions": [
                {"name": "gpus", "expression": has_gpus},
                *({"name": n, "expression": e} for n, e in held.conditions),
            ],
            "variables": _variables(held),
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": _mutation(held)}}],
            "reinvocationPolicy": "Never",
        },
    }


def holding_binding(
    params_namespace: str, name: str = HOLDING[0].policy, skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {
            "policyName": name,
            "paramRef": {
                "name": PARAMS,
                "namespace": params_namespace,
                # no params, nothing held: Deny would refuse every GPU Job of the cluster, a
                # team's or not, while they are missing (as for a moment after an uninstall).
                # The chart ships the ConfigMap; a dev controller writes it before this binding
                "parameterNotFoundAction": "Allow",
            },
            "matchResources": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": sorted({*SYSTEM_NAMESPACES, params_namespace, *skip}),
                        }
                    ]
                }
            },
        },
    }


def api_server_policies(
    params_namespace: str, prefix: str = "", skip: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Every admission policy gpufleet has the API server enforce, with its binding: the
    tenancy policy and a holding policy per held kind, named `prefix` + their names (the
    chart's carry the release's); their params are the controller's to write."""
    holding = []
    for held in HOLDING:
        name = f"{prefix}{held.policy}"
        holding += [holding_policy(held, name), holding_binding(params_namespace, name, skip)]
    return [*admission_policies(params_namespace, f"{prefix}{POLICY}"), *holding]
