#!/usr/bin/env bash
# Installs and builds everything the local Kubernetes, the operators and the tests need.
# Idempotent and cached: packages are installed only when missing, upstream binaries are built
# only when their module files change, and cargo builds incrementally.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# --- Debian packages ---------------------------------------------------------------------------
# command → package that provides it.
declare -A wanted=(
  [ip]=iproute2 [iptables]=iptables [nft]=nftables [conntrack]=conntrack [openssl]=openssl
  [curl]=curl [sysctl]=procps [nsenter]=util-linux [setsid]=util-linux
  # The alerting rules' unit tests (promtool) and the Prometheus the monitoring test runs.
  [promtool]=prometheus [prometheus]=prometheus
)
missing=()
for cmd in "${!wanted[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${wanted[$cmd]}")
done
# What `cargo build` itself needs: etcd-client compiles etcd's API with protoc, and those files
# import the protobuf well-known types. The Dockerfile's build stage installs the same packages
# (tests/e2e/tests/packaging.rs checks that).
cargo_build_packages=(protobuf-compiler libprotobuf-dev)
for package in "${cargo_build_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' || missing+=("$package")
done
# PostgreSQL 15, which the local Kubernetes runs for postgres:15 images (cluster/images.yaml).
# Debian would create and start a cluster of its own on port 5432: told not to.
if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
  missing+=(postgresql-15)
  if [ "$(id -u)" = 0 ]; then
    mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/noops.conf
  fi
fi
# Real nodes (NODE_KIND=kubelet): Debian's containerd, runc and CNI plugins (docs/local-kubernetes.md).
if [ "${NODE_KIND:-agent}" = kubelet ]; then
  for package in containerd runc containernetworking-plugins; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' || missing+=("$package")
  done
  # The images' Debian 12 base (hack/images.sh), made once into the cache.
  dpkg-query -W -f='${Status}' debootstrap 2>/dev/null | grep -q 'ok installed' || missing+=(debootstrap)
fi
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "missing packages (${missing[*]}) and not root to install them"
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Debian's prometheus (and postgresql) would start a service of their own: the tests run
  # their own, so services are told not to start while installing (unless a policy is there).
  policy=/usr/sbin/policy-rc.d
  own_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# noops setup: no service starts while it installs packages.\nexit 101\n' >"$policy"
    chmod +x "$policy"
    own_policy=1
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
  [ -z "$own_policy" ] || rm -f "$policy"
fi

# --- Rust ----------------------------------------------------------------------------------------
# Rust is the one thing setup does not install (a toolchain is the user's choice): say what is
# needed and how to get it. The minimum is the workspace's rust-version.
rust_minimum=$(sed -nE 's/^rust-version = "([0-9.]+)"/\1/p' "$root/Cargo.toml")
rust_hint="install Rust $rust_minimum or newer: curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy, then open a new shell (or: source ~/.cargo/env)"
command -v cargo >/dev/null || die "cargo is missing: $rust_hint"
rust_have=$(rustc --version | awk '{print $2}')
[ "$(printf '%s\n%s\n' "$rust_minimum" "$rust_have" | sort -V | head -1)" = "$rust_minimum" ] ||
  die "Rust $rust_have is older than $rust_minimum: rustup update stable (or $rust_hint)"
# A fresh machine's `make test` fills about 22 GiB (the Go build of the control plane, target/,
# six real nodes' images); say so before an hour's run stops on a full disk.
if [ "$(free_mib "$root")" -lt 22528 ]; then
  log "warning: $(free_mib "$root") MiB free on $(df --output=target "$root" | tail -1): a first make test needs about 22 GiB"
fi
# The Rust workspace builds beside the upstream Go builds: each has long single-threaded stretches
# (k8s-openapi's crate, each Kubernetes link), which the other fills on a machine of few cores.
log "building the Rust workspace (beside the upstream binaries)"
# Its own process group (setsid), so that stopping setup stops every rustc of it.
(cd "$root" && exec setsid cargo build --workspace --bins --quiet) &
cargo_build=$!
trap 'kill -- -"$cargo_build" 2>/dev/null || true' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# --- Go (only for building upstream binaries) ---------------------------------------------------
# Debian's Go when there is none; build-upstream.sh fetches a newer toolchain through it from the
# Go module proxy when it is older than Kubernetes needs.
if ! command -v go >/dev/null; then
  log "installing Debian's Go to bootstrap a newer toolchain"
  apt-get install -y -qq --no-install-recommends golang-go >/dev/null
fi
# NOOPS_UPSTREAM=demo (make demo) leaves out what only the tests use (helm).
"$root/hack/build-upstream.sh" "${NOOPS_UPSTREAM:-all}"
[ "${NODE_KIND:-agent}" != kubelet ] || "$root/hack/build-upstream.sh" kubelet

wait "$cargo_build" || die "the Rust workspace did not build (cargo build --workspace --bins says why)"
trap - EXIT
log "built the Rust workspace"
# The kubectl plugin, where kubectl finds it for `kubectl noops` with .noops/bin on the PATH.
mkdir -p "$bin"
ln -sf "$target_dir/debug/kubectl-noops" "$bin/kubectl-noops"
# The images real nodes run, built from what setup built above.
[ "${NODE_KIND:-agent}" != kubelet ] || "$root/hack/images.sh"
log "setup done"
