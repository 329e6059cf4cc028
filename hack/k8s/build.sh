#!/usr/bin/env bash
# Builds the local Kubernetes control plane that gpufleet's cluster tests and
# `gpufleet dev cluster` run: kube-apiserver, kube-controller-manager, kube-scheduler and kubectl
# at Kubernetes 1.37.2 and etcd (all from this wrapper module), kwok v0.8.0, helm v3.22.0 and
# Karpenter's kwok provider v1.14.1 as `karpenter-kwok`, with its CRDs in karpenter-kwok-crds/
# (go install; newer Karpenter releases need a newer Go), and the CRDs of Karpenter's AWS
# provider v1.14.1 in karpenter-aws-crds/ and of its Azure provider v1.6.3 in
# karpenter-azure-crds/ (from their Go modules; the render tests check against them), and the operators of the workload kinds gpufleet admits (tests/cluster/test_kinds.py):
# JobSet v0.11.1 (`jobset`), Kubeflow Trainer v2.2.0 (`trainer-controller-manager`), KubeRay
# v1.6.0 (`kuberay-operator`), LeaderWorkerSet v0.8.0 (`lws`) and the Kubeflow Training Operator
# v1.7.0 (`training-operator`, PyTorchJob), each with its CRDs in NAME-crds/; and what a real
# node of the harness runs (gpufleet.testing.node): the kubelet and kube-proxy, containerd
# v2.4.2 (`containerd`, `ctr`, `containerd-shim-runc-v2`), runc v1.5.3 (with cgo and libseccomp,
# which it is installed for as root when missing) and the CNI plugins v1.10.0 (cni-plugins/).
# Everything comes from the Go module proxy; binaries go to a cache outside the repository and
# are never committed. Binaries already built are skipped, so a second run takes seconds.
#
#   hack/k8s/build.sh                  # build what is missing, print the cache folder last
#   hack/k8s/build.sh kueue            # also Kueue's manager (benchmarks/vs_kueue.py only)
#   hack/k8s/build.sh kai              # also KAI Scheduler's four processes (vs_kueue.py only)
#   hack/k8s/build.sh --print-replaces # the staging-module replace lines for go.mod
#
# Environment: GPUFLEET_K8S_CACHE (default ~/.cache/gpufleet/k8s/v1.37.2).
set -euo pipefail

K8S_VERSION=v1.37.2
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0  # the chart tests run helm lint/template/install with it
KUEUE_VERSION=v0.19.2  # benchmarks/vs_kueue.py; never needed by the tests
KAI_VERSION=v0.12.0  # benchmarks/vs_kueue.py --systems kai; the newest the Go module proxy serves here
KARPENTER_VERSION=v1.14.1  # `gpufleet dev cluster up --autoscale` and tests/cluster/test_autoscale.py
# the AKSNodeClass CRD the render tests check against: the newest the Go module proxy serves here
KARPENTER_AZURE_VERSION=v1.6.3
# real nodes (tests/cluster/test_install.py, `gpufleet dev cluster up --real-nodes`): the newest
# releases the Go module proxy serves here; containerd 2.x, as kubelets 1.36 and later require
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
CNI_PLUGINS_VERSION=v1.10.0
CNI_PLUGINS=(main/bridge main/loopback ipam/host-local meta/portmap)
# workload kinds (tests/cluster/test_kinds.py): module, version, main package, CRD files
JOBSET=(sigs.k8s.io/jobset v0.11.1 . "config/components/crd/bases/*.yaml")
TRAINER=(github.com/kubeflow/trainer/v2 v2.2.0 ./cmd/trainer-controller-manager
  "manifests/base/crds/*.yaml manifests/base/runtimes/torch_distributed.yaml")
KUBERAY=(github.com/ray-project/kuberay/ray-operator v1.6.0 . "config/crd/bases/ray.io_ray*.yaml")
LWS=(sigs.k8s.io/lws v0.8.0 ./cmd "config/crd/bases/*.yaml")
# Kubeflow Training Operator v1 (PyTorchJob): 1.7 is the last release without admission webhooks
# (1.8 and later make their webhook certificates in a Secret and wait until it is mounted into
# their pod, which a process beside the control plane never has); 1.7 suspends through
# runPolicy.suspend as the later ones do
PYTORCH=(github.com/kubeflow/training-operator v1.7.0 ./cmd/training-operator.v1
  "manifests/base/crds/kubeflow.org_pytorchjobs.yaml")
CACHE=${GPUFLEET_K8S_CACHE:-$HOME/.cache/gpufleet/k8s/$K8S_VERSION}
HERE=$(cd "$(dirname "$0")" && pwd)

if ! command -v go >/dev/null 2>&1; then
  echo "error: Go is not installed. gpufleet builds its test control plane (kube-apiserver," >&2
  echo "etcd, kwok, ...) from Go modules; install Go 1.26 or newer and run $0 again." >&2
  exit 2
fi
# A dependency that wants a newer Go must fail loudly, not switch toolchains behind our back.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

if [[ "${1:-}" == "--print-replaces" ]]; then
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  staging=v0.${K8S_VERSION#v1.}
  sed -n 's|^\s*\(k8s.io/[^ ]*\) => ./staging/src/.*|\1|p' "$gomod" |
    while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
  exit 0
fi

mkdir -p "$CACHE"
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  # Without these, /version reports v0.0.0-master and clients that parse it refuse to start.
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=0000000000000000000000000000000000000000"
  ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# copy_crds FOLDER FILE...: CRDs (and their licence) from a downloaded module into the cache
copy_crds() {
  local folder="$CACHE/$1"
  shift
  rm -rf "$folder" "$folder.partial"
  mkdir -p "$folder.partial"
  cp "$@" "$folder.partial/"
  chmod -R u+w "$folder.partial"
  mv "$folder.partial" "$folder"
}

targets=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm karpenter-kwok
  karpenter-aws-crds karpenter-azure-crds jobset trainer-controller-manager kuberay-operator lws training-operator
  kubelet kube-proxy containerd ctr containerd-shim-runc-v2 runc cni-plugins)
[[ "${1:-}" == "kueue" ]] && targets+=(kueue)
[[ "${1:-}" == "kai" ]] && targets+=(kai-scheduler kai-binder kai-podgrouper kai-queuecontroller)
total=${#targets[@]}
step=0
for name in "${targets[@]}"; do
  step=$((step + 1))
  if [[ -x "$CACHE/$name" && ( "$name" != karpenter-kwok || -d "$CACHE/karpenter-kwok-crds" ) &&
        ( ! " jobset trainer-controller-manager kuberay-operator lws training-operator " =~ " $name " ||
          -d "$CACHE/$name-crds" ) ]] ||
     [[ ( "$name" == *-crds || "$name" == cni-plugins ) && -d "$CACHE/$name" ]]; then
    echo "[$step/$total] $name: already built"
    continue
  fi
  if [[ "$name" == kube-apiserver ]]; then
    echo "[$step/$total] $name: building (the first build of the Kubernetes binaries takes a while)..."
  elif [[ "$name" != *-crds ]]; then
    echo "[$step/$total] $name: building..."
  fi
  start=$(date +%s)
  tmp="$CACHE/.$name.partial"
  case "$name" in
    etcd)
      (cd "$HERE" && go build -trimpath -ldflags "-s -w" -o "$tmp" go.etcd.io/etcd/server/v3) ;;
    karpenter-kwok)
      # its main package is the module's kwok/ folder; the binary is named after it
      gobin=$(mktemp -d)
      GOBIN="$gobin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/karpenter/kwok@$KARPENTER_VERSION"
      mv "$gobin/kwok" "$tmp"
      rmdir "$gobin"
      # NodePool/NodeClaim (and the CRDs Karpenter watches besides) and KWOKNodeClass, from the
      # module just downloaded, so the harness needs no copy of them
      dir=$(go mod download -json "sigs.k8s.io/karpenter@$KARPENTER_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
      copy_crds karpenter-kwok-crds "$dir"/kwok/charts/crds/*.yaml "$dir"/kwok/apis/crds/*.yaml \
        "$dir/LICENSE" ;;
    jobset|trainer-controller-manager|kuberay-operator|lws|training-operator)
      # built inside the module's own folder, with its own go.mod and go.sum: `go install
      # module@version` asks the proxy for the module's version list, which it refuses for some
      case "$name" in
        jobset) spec=("${JOBSET[@]}") ;;
        trainer-controller-manager) spec=("${TRAINER[@]}") ;;
        lws) spec=("${LWS[@]}") ;;
        training-operator) spec=("${PYTORCH[@]}") ;;
        *) spec=("${KUBERAY[@]}") ;;
      esac
      dir=$(GOFLAGS=-mod=mod go mod download -json "${spec[0]}@${spec[1]}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
      (cd "$dir" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" -o "$tmp" "${spec[2]}")
      # shellcheck disable=SC2086  # the CRD patterns are globs
      copy_crds "$name-crds" $(cd "$dir" && for f in ${spec[3]}; do echo "$dir/$f"; done) "$dir/LICENSE" ;;
    kai-*)
      # built inside its module's folder, as the workload operators are (the CRDs are read
      # from the module by the benchmark)
      dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/NVIDIA/KAI-scheduler@$KAI_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
      (cd "$dir" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$tmp" "./cmd/${name#kai-}") ;;
    containerd|ctr|containerd-shim-runc-v2)
      # without the btrfs, devmapper and ZFS snapshotters (cgo; the nodes use overlayfs)
      dir=$(go mod download -json "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
      (cd "$dir" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
        -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
        -o "$tmp" "./cmd/$name") ;;
    runc)
      # runc needs cgo (its nsexec is C) and libseccomp: pods ask for the RuntimeDefault profile
      if [[ ! -f /usr/include/seccomp.h ]]; then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
          echo "[$step/$total] $name: installing libseccomp-dev (Debian package)..."
          DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            libseccomp-dev >/dev/null 2>&1 || { apt-get update -q >/dev/null &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            libseccomp-dev >/dev/null; }
        else
          echo "error: runc needs libseccomp's headers: apt-get install libseccomp-dev" >&2
          exit 2
        fi
      fi
      dir=$(go mod download -json "github.com/opencontainers/runc@$RUNC_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
      (cd "$dir" && CGO_ENABLED=1 go build -trimpath -tags seccomp \
        -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" -o "$tmp" .) ;;
    cni-plugins)
      dir=$(go mod download -json "github.com/containernetworking/plugins@$CNI_PLUGINS_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
      rm -rf "$tmp" && mkdir -p "$tmp"
      for plugin in "${CNI_PLUGINS[@]}"; do
        (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$tmp/${plugin#*/}" "./plugins/$plugin")
      done
      cp "$dir/LICENSE" "$tmp/" && chmod u+w "$tmp/LICENSE"
      rm -rf "${CACHE:?}/$name" ;;
    karpenter-aws-crds)
      dir=$(go mod download -json "github.com/aws/karpenter-provider-aws@$KARPENTER_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
      copy_crds karpenter-aws-crds "$dir"/pkg/apis/crds/*.yaml "$dir/LICENSE"
      echo "[$step/$total] $name: copied from its Go module"
      continue ;;
    karpenter-azure-crds)
      dir=$(go mod download -json "github.com/Azure/karpenter-provider-azure@$KARPENTER_AZURE_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
      copy_crds karpenter-azure-crds "$dir"/pkg/apis/crds/*.yaml "$dir/LICENSE"
      echo "[$step/$total] $name: copied from its Go module"
      continue ;;
    kwok|helm|kueue)
      module="sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
      [[ "$name" == helm ]] && module="helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
      # its own go.mod (Kueue v0.19.2: Kubernetes API 0.36), so built apart from the wrapper module
      [[ "$name" == kueue ]] && module="sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
      gobin=$(mktemp -d)
      GOBIN="$gobin" go install -trimpath -ldflags "-s -w" "$module"
      mv "$gobin/$name" "$tmp"
      rmdir "$gobin" ;;
    *)
      (cd "$HERE" && go build -trimpath -ldflags "$ldflags" -o "$tmp" "k8s.io/kubernetes/cmd/$name") ;;
  esac
  mv "$tmp" "$CACHE/$name"   # only complete binaries count as built
  echo "[$step/$total] $name: built in $(( $(date +%s) - start ))s"
done
echo "$CACHE"
