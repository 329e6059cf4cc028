#!/usr/bin/env bash
# The Debian packages some tests need, installed when we may (root and apt-get): Prometheus (the
# metrics test), Chromium (the HTML report and dashboard tests) and PostgreSQL (the ledger
# tests; its server binaries are not on PATH, so it is found by pg_ctlcluster) and the Distribution
# registry and buildah (docker-registry, buildah: the tests of gpufleet run push to the one, and
# build a Dockerfile with the other), systemd (systemd-analyze verify checks the standalone
# agent's unit) and Slurm with munge (a standalone agent drains its Slurm node). Any package that
# fails to install fails this script, naming it. Without root or apt-get it only warns: the
# tests that need a missing package skip (and fail under CI).
# SYSTEM_DEPS overrides the "package:command" list (the test of this script does).
set -euo pipefail
deps="${SYSTEM_DEPS:-prometheus:prometheus chromium:chromium postgresql:pg_ctlcluster docker-registry:docker-registry buildah:buildah systemd:systemd-analyze munge:munged slurmctld:slurmctld slurmd:slurmd}"
updated=""
for pair in $deps; do
  pkg="${pair%%:*}"; cmd="${pair#*:}"
  command -v "$cmd" >/dev/null 2>&1 && continue
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "warning: $pkg not found: the tests that need it will be skipped (apt-get install $pkg)"
    continue
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q --no-install-recommends "$pkg" >/dev/null 2>&1; then
    if [ -z "$updated" ]; then
      apt-get update -q >/dev/null 2>&1 || echo "warning: apt-get update failed" >&2
      updated=1
    fi
    if ! apt-get install -y -q --no-install-recommends "$pkg" >/dev/null; then
      echo "error: apt-get install $pkg failed (see above): the tests that need it cannot run" >&2
      exit 1
    fi
  fi
done
