#!/usr/bin/env bash
# Builds gpufleet's OCI image without a container engine: a Debian bookworm root filesystem
# with its python3 (mmdebstrap), the Python packages of hack/image/requirements.txt (wheels
# only, for CPython 3.11 on x86_64), and gpufleet itself, in three layers, assembled into an OCI
# image layout by umoci. Also the pause image the local harness's real nodes run their pod
# sandboxes from, compiled from the pause.c of the Kubernetes module (hack/k8s builds from).
#
#   hack/image/build.sh               # both images into build/image/, digest and size printed
#   hack/image/build.sh gpufleet      # only the gpufleet image
#   hack/image/build.sh pause         # only the pause image
#   hack/image/build.sh python-base   # only the base image the tests of gpufleet run use
#   hack/image/build.sh --lock        # rewrite requirements.txt from pyproject.toml
#
# Outputs, each an OCI image layout in a tar archive (`ctr images import`, `skopeo copy
# oci-archive:...`, `crane push` of the unpacked folder):
#   build/image/gpufleet.oci.tar   ghcr.io/gpufleet/gpufleet:<version>
#   build/image/pause.oci.tar      localhost/gpufleet/pause:3.10.2
#   build/image/python-base.oci.tar localhost/gpufleet/python-base:3.11 (Debian and python3)
#
# Reproducible: every timestamp is SOURCE_DATE_EPOCH (default: the last commit's time), file
# owners and order are fixed, so the same Debian packages and the same source give the same
# digest. The Debian layer and the packages layer are cached in ~/.cache/gpufleet/image, keyed
# by what goes into them; a rebuild after a change to gpufleet's code redoes only its layer.
#
# Needs (Debian packages): mmdebstrap and umoci; gcc and libc6-dev for the pause image. As root,
# missing ones are installed. With Docker or Podman, `docker build .` builds the same layout
# from the Dockerfile instead.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${GPUFLEET_IMAGE_OUT:-$ROOT/build/image}
CACHE=${GPUFLEET_IMAGE_CACHE:-$HOME/.cache/gpufleet/image}
SUITE=bookworm
MIRROR=${GPUFLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3: the runtime; ca-certificates: TLS to clouds, registries and the notification sinks;
# tzdata: the time zones in cost reports
PACKAGES=python3,ca-certificates,tzdata
PYTHON_VERSION=3.11  # bookworm's python3
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")
IMAGE=ghcr.io/gpufleet/gpufleet
PAUSE_TAG=3.10.2  # the TAG of the pause Makefile in Kubernetes v1.37.2
PAUSE_IMAGE=localhost/gpufleet/pause
BASE_IMAGE=localhost/gpufleet/python-base
K8S_VERSION=v1.37.2
UID_NONROOT=65532  # the chart's runAsUser
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin  # the images' PATH

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)}
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

say() { printf '%s\n' "$*" >&2; }

need() {  # need COMMAND DEBIAN-PACKAGE
  command -v "$1" >/dev/null 2>&1 && return
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "installing $2 (Debian package)..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$2" >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "$2" >/dev/null; }
  else
    say "error: $1 not found: install the Debian package $2 (apt-get install $2) and run $0 again"
    exit 2
  fi
}

# repro_tar FOLDER ARCHIVE: a tar of FOLDER's contents that depends only on them: sorted
# names, every mtime SOURCE_DATE_EPOCH, numeric owners as they are in FOLDER, no atime/ctime
repro_tar() {
  tar --create --file "$2" --directory "$1" --sort=name --mtime="@$SOURCE_DATE_EPOCH" \
    --numeric-owner --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    .
}

key_of() { sha256sum | cut -c1-16; }

# --- layer 1: Debian with python3 -------------------------------------------------------------
debian_layer() {
  local key
  key=$(printf '%s\n' "$SUITE" "$MIRROR" "$PACKAGES" "$UID_NONROOT" "$(sed -n '/^debian_layer/,/^}/p' "$0")" | key_of)
  local layer="$CACHE/debian-$key.tar"
  if [[ -f $layer ]]; then say "[gpufleet] Debian $SUITE layer: cached"; echo "$layer"; return; fi
  need mmdebstrap mmdebstrap
  say "[gpufleet] Debian $SUITE layer: mmdebstrap (downloads about 30 MB of packages)..."
  mkdir -p "$CACHE"
  # mmdebstrap writes a reproducible tarball itself when SOURCE_DATE_EPOCH is set; documentation,
  # man pages and translations are left out (copyright files stay), as are apt's lists
  mmdebstrap --quiet --format=tar --variant=essential --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook="echo 'nonroot:x:$UID_NONROOT:$UID_NONROOT:nonroot:/home/nonroot:/usr/sbin/nologin' >> \"\$1/etc/passwd\"" \
    --customize-hook="echo 'nonroot:x:$UID_NONROOT:' >> \"\$1/etc/group\"" \
    --customize-hook="install -d -o $UID_NONROOT -g $UID_NONROOT -m 0755 \"\$1/home/nonroot\"" \
    --customize-hook='rm -rf "$1"/var/cache/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    "$SUITE" "$layer.partial" "$MIRROR" >&2
  mv "$layer.partial" "$layer"
  echo "$layer"
}

# pip_target FOLDER ARGS...: install wheels for the image's Python (not this machine's) into
# FOLDER/usr/local/lib/python3.11/dist-packages, which bookworm's python3 has on its path
pip_target() {
  local folder=$1; shift
  local site="$folder/usr/local/lib/python$PYTHON_VERSION/dist-packages"
  mkdir -p "$site"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-compile --no-deps \
    --only-binary=:all: --target "$site" \
    --python-version "$PYTHON_VERSION" --implementation cp --abi "cp${PYTHON_VERSION/./}" \
    --abi abi3 --abi none --platform manylinux_2_36_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any "$@"
  # pip's own records name the build machine's paths; the image needs none of them
  rm -rf "$site/bin"
  find "$site" \( -name RECORD -o -name direct_url.json \) -path '*.dist-info/*' -delete
  compile "$folder" "$site"
}

# The root filesystem is read-only in the chart's pods: Python cannot write bytecode there, so
# it is compiled here (hash-checked, so no source mtime is recorded), when this machine's
# python3 writes the same bytecode format as the image's. compile ROOT FOLDER: the source paths
# recorded are those in the image (ROOT stripped), not this machine's
compile() {
  if python3 -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$PYTHON_VERSION'.split('.'))))"; then
    python3 -m compileall -q -j0 --invalidation-mode checked-hash -s "$1" -p / "$2" >/dev/null
  else
    say "warning: python3 here is not $PYTHON_VERSION: the image ships without bytecode (slower starts)"
  fi
}

# --- layer 2: the Python packages ------------------------------------------------------------
packages_layer() {
  local key layer tmp
  key=$(cat "$HERE/requirements.txt" <(sed -n '/^pip_target/,/^}/p;/^compile/,/^}/p' "$0") | key_of)
  layer="$CACHE/packages-$key.tar"
  if [[ -f $layer ]]; then say "[gpufleet] Python packages layer: cached"; echo "$layer"; return; fi
  say "[gpufleet] Python packages layer: $(grep -vc '^#' "$HERE/requirements.txt") packages from PyPI..."
  tmp=$(mktemp -d)
  pip_target "$tmp/root" -r "$HERE/requirements.txt"
  repro_tar "$tmp/root" "$layer.partial"
  rm -rf "$tmp"
  mv "$layer.partial" "$layer"
  echo "$layer"
}

# --- layer 3: gpufleet --------------------------------------------------------------------------
gpufleet_layer() {
  local tmp=$1
  say "[gpufleet] gpufleet $VERSION layer..."
  # a copy of the source, so the build never writes into the checkout (build/, egg-info)
  mkdir -p "$tmp/src" "$tmp/wheel" "$tmp/root/usr/local/bin"
  git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
    (cd "$ROOT" && xargs -0 cp --parents --no-dereference -t "$tmp/src" 2>/dev/null || true)
  python3 -m pip wheel --quiet --disable-pip-version-check --no-deps \
    -w "$tmp/wheel" "$tmp/src" >/dev/null
  pip_target "$tmp/root" "$tmp"/wheel/gpufleet-*.whl
  # the console script, written here: pip's would name this machine's interpreter
  printf '#!/usr/bin/python3\nimport sys\nfrom gpufleet.cli.entry import run\nsys.exit(run())\n' \
    >"$tmp/root/usr/local/bin/gpufleet"
  chmod 0755 "$tmp/root/usr/local/bin/gpufleet"
  repro_tar "$tmp/root" "$tmp/gpufleet.tar"
  echo "$tmp/gpufleet.tar"
}

# assemble NAME TAG ARCHIVE CONFIG-ARGS -- LAYER...: an OCI layout with the layers, in a tar
assemble() {
  local name=$1 tag=$2 archive=$3; shift 3
  local config=()
  while [[ $1 != -- ]]; do config+=("$1"); shift; done
  shift
  need umoci umoci
  local tmp
  tmp=$(mktemp -d)
  umoci init --layout "$tmp/oci"
  umoci new --image "$tmp/oci:$tag"
  local layer
  for layer in "$@"; do
    umoci raw add-layer --image "$tmp/oci:$tag" --history.created "$CREATED" \
      --history.created_by "hack/image/build.sh: $(basename "$layer" .tar)" "$layer"
  done
  umoci config --image "$tmp/oci:$tag" --no-history --created "$CREATED" --os linux --architecture amd64 \
    --author "gpufleet" --config.label "org.opencontainers.image.version=$tag" \
    --config.label "org.opencontainers.image.source=https://github.com/gpufleet/gpufleet" \
    "${config[@]}"
  umoci gc --layout "$tmp/oci"
  # ref.name is the full reference, as containerd's import reads it
  python3 - "$tmp/oci/index.json" "$name:$tag" <<'EOF'
import json, sys
path, ref = sys.argv[1:]
index = json.load(open(path))
for manifest in index["manifests"]:
    manifest.setdefault("annotations", {})["org.opencontainers.image.ref.name"] = ref
open(path, "w").write(json.dumps(index, separators=(",", ":")))
EOF
  find "$tmp/oci" -exec chown -h 0:0 {} + 2>/dev/null || true
  mkdir -p "$(dirname "$archive")"
  repro_tar "$tmp/oci" "$archive.partial"
  mv "$archive.partial" "$archive"
  report "$name:$tag" "$tmp/oci" "$archive"
  rm -rf "$tmp"
}

report() {  # the digest and the sizes, as JSON on stdout
  python3 - "$1" "$2" "$3" <<'EOF'
import json, os, sys
ref, layout, archive = sys.argv[1:]
index = json.load(open(os.path.join(layout, "index.json")))
digest = index["manifests"][0]["digest"]
blob = lambda d: os.path.join(layout, "blobs", *d.split(":"))
manifest = json.load(open(blob(digest)))
compressed = sum(layer["size"] for layer in manifest["layers"]) + manifest["config"]["size"]
print(json.dumps({"image": ref, "digest": digest, "layers": len(manifest["layers"]),
                  "compressed_bytes": compressed, "archive": archive,
                  "archive_bytes": os.path.getsize(archive)}))
EOF
}

build_gpufleet() {
  local debian packages tmp
  debian=$(debian_layer)
  packages=$(packages_layer)
  tmp=$(mktemp -d)
  gpufleet_layer "$tmp" >/dev/null
  assemble "$IMAGE" "$VERSION" "$OUT/gpufleet.oci.tar" \
    --config.user "$UID_NONROOT:$UID_NONROOT" --config.workingdir /home/nonroot \
    --config.entrypoint gpufleet \
    --config.env "PATH=$IMAGE_PATH" \
    --config.env LANG=C.UTF-8 --config.env PYTHONUNBUFFERED=1 \
    --config.env PYTHONDONTWRITEBYTECODE=1 --config.env HOME=/home/nonroot \
    -- "$debian" "$packages" "$tmp/gpufleet.tar"
  rm -rf "$tmp"
}

# the base image the tests of `gpufleet run` build on: Debian with its python3, nothing else
build_python_base() {
  local debian
  debian=$(debian_layer)
  assemble "$BASE_IMAGE" "$PYTHON_VERSION" "$OUT/python-base.oci.tar" \
    --config.cmd python3 \
    --config.env "PATH=$IMAGE_PATH" \
    --config.env LANG=C.UTF-8 --config.env PYTHON_VERSION=$PYTHON_VERSION \
    -- "$debian"
}

build_pause() {
  need gcc gcc
  local dir tmp
  dir=$(cd "$ROOT/hack/k8s" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  say "[pause] compiling $dir/build/pause/linux/pause.c..."
  tmp=$(mktemp -d)
  mkdir -p "$tmp/root"
  # the flags of the pause Makefile
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG-gpufleet" -o "$tmp/root/pause" \
    "$dir/build/pause/linux/pause.c"
  strip "$tmp/root/pause"
  chmod 0755 "$tmp/root/pause"
  repro_tar "$tmp/root" "$tmp/pause.tar"
  assemble "$PAUSE_IMAGE" "$PAUSE_TAG" "$OUT/pause.oci.tar" \
    --config.user 65535:65535 --config.entrypoint /pause -- "$tmp/pause.tar"
  rm -rf "$tmp"
}

case "${1:-all}" in
  gpufleet) build_gpufleet ;;
  pause) build_pause ;;
  python-base) build_python_base ;;
  all) build_gpufleet; build_pause; build_python_base ;;
  --lock)
    report=$(mktemp)
    python3 -m pip install --quiet --disable-pip-version-check --dry-run --ignore-installed \
      --only-binary=:all: --report "$report" "$ROOT" >/dev/null
    { sed -n '1,/^[^#]/{/^#/p}' "$HERE/requirements.txt"
      python3 - "$report" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
for item in sorted(report["install"], key=lambda i: i["metadata"]["name"].lower()):
    if item["metadata"]["name"] != "gpufleet":
        print(f'{item["metadata"]["name"]}=={item["metadata"]["version"]}')
EOF
    } >"$HERE/requirements.txt.new"
    mv "$HERE/requirements.txt.new" "$HERE/requirements.txt"
    rm -f "$report"
    say "wrote $HERE/requirements.txt" ;;
  *) say "usage: $0 [all|gpufleet|pause|python-base|--lock]"; exit 2 ;;
esac
