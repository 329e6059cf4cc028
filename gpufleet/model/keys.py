"""Every label, annotation, taint, condition and resource name gpufleet reads or writes on
Kubernetes objects, defined once. A kind's own keys (the label a Job controller puts on its
pods, for instance) stay with its adapter in gpufleet/kube/kinds/."""

from __future__ import annotations

# --- on workloads: what a user sets ---------------------------------------------------------
TEAM_LABEL = "gpufleet.io/team"
CLASS_LABEL = "gpufleet.io/class"  # reserved | elastic
PRIORITY_LABEL = "gpufleet.io/priority"
POOL_LABEL = "gpufleet.io/pool"  # on a workload: the pool it asks for; on a node: its pool
TOPOLOGY_LABEL = "gpufleet.io/topology"  # block | clique: a gang must run inside one (R8)
# the GPU types a workload accepts, comma-separated, the most preferred first (an annotation:
# a label's value cannot hold a list)
GPU_TYPES_ANNOTATION = "gpufleet.io/gpu-types"
EXTERNAL_ID_ANNOTATION = "gpufleet.io/external-id"  # on a workload: its submitter's own id

# --- on workloads and their pods: what gpufleet sets ----------------------------------------
MANAGED_ANNOTATION = "gpufleet.io/managed"
# who created a managed workload, as the API server saw them: admission sets it (over whatever
# the manifest said), so a list filtered by submitter can be trusted
SUBMITTER_ANNOTATION = "gpufleet.io/submitter"
GANG_LABEL = "gpufleet.io/gang"  # the pods of one gang (the Job's name may not be known yet)
WORKLOAD_LABEL = "gpufleet.io/workload"  # on a gated kind's pods: its GPUWorkload's name
ADMISSION_GATE = "gpufleet.io/admission"  # the scheduling gate that holds pods until admitted
ADMITTED_POOL_ANNOTATION = "gpufleet.io/admitted-pool"
ADMITTED_AT_ANNOTATION = "gpufleet.io/admitted-at"
# on a pod released at admission, with the two above: the nodes of the whole admission
ADMITTED_NODES_ANNOTATION = "gpufleet.io/admitted-nodes"

# --- a fleet of clusters: on Jobs submitted to the hub and their copies in workers ----------
CLUSTER_LABEL = "gpufleet.io/cluster"  # on a hub Job: the cluster it must run in, or "auto"
HUB_MANAGER = "gpufleet.io/hub"  # a hub Job's spec.managedBy: the hub's Job controller skips it
HUB_JOB_LABEL = "gpufleet.io/hub-job"  # on a worker's copy: the uid of the hub Job it copies
DISPATCHED_TO_ANNOTATION = "gpufleet.io/dispatched-to"  # on a hub Job: where its copy runs
# on a hub Job: clusters lost while its copy was there; the copy is removed when they return
STALE_IN_ANNOTATION = "gpufleet.io/stale-in"
HUB_MESSAGE_ANNOTATION = "gpufleet.io/hub-message"  # on a hub Job: why it waits at the hub
HUB_STATE_ANNOTATION = "gpufleet.io/state"  # on a hub Job: its copy's GPUWorkload state

# --- on nodes --------------------------------------------------------------------------------
GPU_TYPE_LABEL = "gpufleet.io/gpu-type"
BLOCK_LABEL = "gpufleet.io/block"  # a network block or rack, named by the platform team (R8)
QUARANTINE_TAINT = "gpufleet.io/gpu-unhealthy"
QUARANTINE_REASON_ANNOTATION = "gpufleet.io/quarantine-reason"
QUARANTINED_AT_ANNOTATION = "gpufleet.io/quarantined-at"
QUARANTINE_HISTORY_ANNOTATION = "gpufleet.io/quarantine-history"  # times, comma-separated
QUARANTINE_ESCALATED_ANNOTATION = "gpufleet.io/quarantine-escalated"
RELEASE_ANNOTATION = "gpufleet.io/release"  # set by a person (or `gpufleet nodes release`)
RELEASED_MANUALLY_ANNOTATION = "gpufleet.io/released-manually"  # what the controller recorded
GPU_HEALTHY_CONDITION = "GPUHealthy"  # the node condition the agent writes

# --- objects gpufleet owns -------------------------------------------------------------------
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpufleet"
HEALTH_BREAKER = "gpufleet-health-breaker"  # the ConfigMap that stops quarantines (a person's)

# --- Kubernetes' and NVIDIA's ----------------------------------------------------------------
GPU_RESOURCE = "nvidia.com/gpu"
ZONE_LABEL = "topology.kubernetes.io/zone"
CLIQUE_LABEL = "nvidia.com/gpu.clique"  # the NVLink clique the GPU Operator labels (R8)
PRODUCT_LABEL = "nvidia.com/gpu.product"

# the header every write to gpufleet's API carries (the SDK, the CLI and the dashboard send it):
# a browser sends a custom header cross-site only after a preflight the server never answers,
# so another site's page cannot make a signed-in browser cancel work
WRITE_HEADER = "X-Gpufleet-Client"
