#!/usr/bin/env bash
# Builds the upstream binaries (Kubernetes control plane 1.34 and 1.33, kubectl, kube-proxy, etcd 3.5 and 3.6,
# versitygw, helm; the kubelet of real nodes only when asked: `build-upstream.sh kubelet`) from the wrapper
# Go modules under tools/, once. Results are cached outside the clone, keyed by a hash of each wrapper's
# module files and the build recipe, so a fresh clone (CI) reuses them and a change of version rebuilds. `.noops/bin` gets symlinks to the cached binaries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${NOOPS_CACHE:-$HOME/.cache/noops}
bin="$root/.noops/bin"
# Kubernetes 1.34 needs Go 1.24 or newer: with an older Go (setup installs Debian's when there is
# none), the toolchain it needs comes from the Go module proxy. Decided here, so that every caller
# (setup, or this script run alone) builds with it.
if [ -z "${GOTOOLCHAIN:-}" ]; then
  if [ "$(GOTOOLCHAIN=local go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')" -ge 24 ]; then
    GOTOOLCHAIN=local
  else
    GOTOOLCHAIN=go1.26.11
    echo "upstream: using Go toolchain $GOTOOLCHAIN from the module proxy"
  fi
fi
export GOTOOLCHAIN CGO_ENABLED=0 GOFLAGS=-mod=mod
export GOMODCACHE=${GOMODCACHE:-$(go env GOMODCACHE)} GOCACHE=${GOCACHE:-$(go env GOCACHE)}
mkdir -p "$bin" "$cache/upstream"

# A build stopped halfway leaves no half-made entry behind (its folder is removed on the way out).
building=
trap '[ -z "$building" ] || rm -rf "$building"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# Bump when the way binaries are built changes (flags, names), to invalidate every cache entry.
recipe=1
# key <module dir>: a short hash of the module files and the build recipe.
key() { { cat "$root/tools/$1/go.mod" "$root/tools/$1/go.sum"; echo "recipe=$recipe"; } | sha256sum | cut -c1-16; }

# exec_name <package>: the name go build gives its binary: the last element of the path, or the
# one before a major version suffix (go.etcd.io/etcd/server/v3 → server).
exec_name() {
  local name=${1##*/}
  if [[ $name =~ ^v[0-9]+$ && $1 == */* ]]; then
    name=${1%/*}; name=${name##*/}
  fi
  echo "$name"
}

# build <module dir> <ldflags> <binary>=<package>...: builds every binary of one wrapper module.
build() {
  local mod=$1 flags=$2; shift 2
  local out="$cache/upstream/$mod-$(key "$mod")"
  if [ -f "$out/.complete" ]; then
    echo "upstream: $mod cached ($out)"
  else
    echo "upstream: building $mod (slow on a cold cache) ..."
    local start=$SECONDS tmp="$out.tmp.$$" pair packages=()
    rm -rf "$tmp"; mkdir -p "$tmp"; building=$tmp
    for pair in "$@"; do packages+=("${pair#*=}"); done
    # One go build for all of a module's binaries: their links run side by side (each a
    # single-threaded minute for Kubernetes), and the packages are loaded once.
    (cd "$root/tools/$mod" && go build -trimpath -ldflags "$flags" -o "$tmp/" "${packages[@]}")
    for pair in "$@"; do
      local built
      built=$(exec_name "${pair#*=}")
      [ "$built" = "${pair%%=*}" ] || mv "$tmp/$built" "$tmp/${pair%%=*}"
    done
    touch "$tmp/.complete"; rm -rf "$out"; mv "$tmp" "$out"; building=
    echo "upstream: built $mod in $((SECONDS - start))s"
    # Older builds of the same entry are of no further use (only <mod>-<key>: k8s-1.33-* is not k8s's).
    local old
    for old in "$cache/upstream/$mod"-*; do
      [[ ${old##*/} =~ ^$mod-[0-9a-f]{16}$ ]] && [ "$old" != "$out" ] && rm -rf "$old"
    done
  fi
  local dest=$bin; case $mod in etcd-* | k8s-*) dest="$bin/$mod";; esac
  mkdir -p "$dest"
  for pair in "$@"; do ln -sfn "$out/${pair%%=*}" "$dest/${pair%%=*}"; done
}

# k8s_ldflags <module dir>: the version stamps of a Kubernetes build, from its module's require.
k8s_ldflags() {
  local version minor flags="-s -w" pkg
  version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$root/tools/$1/go.mod")
  minor=$(echo "$version" | cut -d. -f2)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# all, or demo (what `make demo` needs: all but helm, which only the tests use), or one of etcd,
# versitygw, helm, k8s, k8s-1.33, kubelet.
what=${1:-all}
wanted() { [ "$what" = "$1" ] || [ "$what" = all ] || { [ "$what" = demo ] && [ "$1" != helm ]; }; }
if wanted etcd; then
  for mod in etcd-3.5 etcd-3.6; do
    build "$mod" "-s -w" etcd=go.etcd.io/etcd/server/v3 \
      etcdctl=go.etcd.io/etcd/etcdctl/v3 etcdutl=go.etcd.io/etcd/etcdutl/v3
  done
fi
if wanted versitygw; then
  # The S3-compatible object store of examples/object-store (backups go there).
  vgw_version=$(awk '$1 == "require" && $2 == "github.com/versity/versitygw" { print $3 }' "$root/tools/versitygw/go.mod")
  build versitygw "-s -w -X main.Version=$vgw_version -X main.Build=noops" versitygw=github.com/versity/versitygw/cmd/versitygw
fi
if wanted helm; then
  # Only the tests use it: the chart renders what deploy/ holds, and real nodes install the
  # operator with it.
  build helm "-s -w" helm=helm.sh/helm/v3/cmd/helm
fi
if wanted k8s; then
  k=k8s.io/kubernetes/cmd
  build k8s "$(k8s_ldflags k8s)" kube-apiserver=$k/kube-apiserver kube-controller-manager=$k/kube-controller-manager \
    kube-scheduler=$k/kube-scheduler kube-proxy=$k/kube-proxy kubectl=$k/kubectl
fi
if wanted k8s-1.33; then
  k=k8s.io/kubernetes/cmd
  # The previous minor, for hosted control planes (and later machines) to upgrade from.
  build k8s-1.33 "$(k8s_ldflags k8s-1.33)" kube-apiserver=$k/kube-apiserver \
    kube-controller-manager=$k/kube-controller-manager kube-scheduler=$k/kube-scheduler kube-proxy=$k/kube-proxy
fi
if [ "$what" = kubelet ]; then
  # The upstream kubelet of real nodes (NODE_KIND=kubelet), the control plane's version. Built only
  # when asked: the node agent's nodes do not need it.
  [ "$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$root/tools/kubelet/go.mod")" = \
    "$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$root/tools/k8s/go.mod")" ] ||
    { echo "tools/kubelet requires another k8s.io/kubernetes than tools/k8s: give both the same" >&2; exit 1; }
  build kubelet "$(k8s_ldflags kubelet)" kubelet=k8s.io/kubernetes/cmd/kubelet
fi
