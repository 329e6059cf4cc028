{{/* Generated from the workload-kind registry (gpufleet/kube/kinds/__init__.py) by
     `make chart-kinds`; do not edit: a test fails when this differs. */}}

{{/* the admission webhook: creating any kind the API server does not hold */}}
{{- define "gpufleet.kinds.admissionRules" -}}
- {"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"], "resources": ["jobsets"], "operations": ["CREATE"], "scope": "Namespaced"}
- {"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["v1alpha1"], "resources": ["trainjobs"], "operations": ["CREATE"], "scope": "Namespaced"}
- {"apiGroups": ["ray.io"], "apiVersions": ["v1"], "resources": ["rayjobs"], "operations": ["CREATE"], "scope": "Namespaced"}
- {"apiGroups": ["kubeflow.org"], "apiVersions": ["v1"], "resources": ["pytorchjobs"], "operations": ["CREATE"], "scope": "Namespaced"}
{{- end }}

{{/* the check webhook: the creation of the kinds the API server holds */}}
{{- define "gpufleet.kinds.checkRules" -}}
- {"apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs"], "operations": ["CREATE"], "scope": "Namespaced"}
- {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"], "operations": ["CREATE"], "scope": "Namespaced"}
- {"apiGroups": ["leaderworkerset.x-k8s.io"], "apiVersions": ["v1"], "resources": ["leaderworkersets"], "operations": ["CREATE"], "scope": "Namespaced"}
- {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"], "scope": "Namespaced"}
{{- end }}

{{/* the controller: read, admit, suspend and resume every kind's objects */}}
{{- define "gpufleet.kinds.controllerRules" -}}
- {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "patch"]}
- {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get", "list", "watch", "patch"]}
- {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["get", "list", "watch", "patch"]}
- {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch", "patch"]}
- {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["get", "list", "watch", "patch"]}
- {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "patch"]}
- {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"], "verbs": ["get", "list", "watch", "patch"]}
{{- end }}

{{/* the server: cancel (delete) every kind's objects */}}
{{- define "gpufleet.kinds.serverRules" -}}
- {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["delete"]}
- {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["delete"]}
- {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["delete"]}
- {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["delete"]}
- {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["delete"]}
- {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["delete"]}
- {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"], "verbs": ["delete"]}
{{- end }}
