# Shared settings of the local Kubernetes scripts. Sourced, not run.
# shellcheck shell=bash

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state="$root/.noops"
bin="$state/bin"
cluster="$state/cluster"
pki="$cluster/pki"
run="$cluster/run"
logs="$state/logs"
kubeconfig="$state/kubeconfig"

# Networks. The pod CIDR is the bridge's; the service CIDR is routed onto the same bridge, so a
# packet for either never has a route off this machine. Neither may contain the host's resolver.
node_name=noops-node
bridge=noops0
pod_cidr=10.244.0.0/16
node_ip=10.244.0.1
service_cidr=10.96.0.0/16
api_service_ip=10.96.0.1
cluster_domain=cluster.local
k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$root/tools/k8s/go.mod")

# Ports on this machine (etcd of the control plane on loopback, away from etcd's usual ports).
etcd_client_port=12379
etcd_peer_port=12380
apiserver_port=6443
kubelet_port=10250

target_dir=${CARGO_TARGET_DIR:-$root/target}
node_agent_bin="$target_dir/debug/noops-node"

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# alive <name>: whether the component started under that name is still running.
alive() {
  local pidfile="$run/$1.pid"
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

# The interface of the default route (the way off this machine), if there is one.
outward_interface() { ip -4 route show default | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }'; }

kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

# An operator left running in the cluster by `make demo` would reconcile test and benchmark
# objects too; tests and benchmarks run their own.
stop_demo_operator() { kubectl delete deployment -n noops-system noops-operator --ignore-not-found --wait=false >/dev/null 2>&1 || true; }
