# Shared settings and helpers of the local Kubernetes scripts. Sourced, not run.
# shellcheck shell=bash

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state="$root/.noops"
bin="$state/bin"
cluster="$state/cluster"
pki="$cluster/pki"
run="$cluster/run"
logs="$state/logs"
kubeconfig="$state/kubeconfig"

# Networks. Everything sits on one bridge: the control plane holds 10.244.0.1, node k (1..16)
# holds 10.244.k.1 and gives its pods addresses from 10.244.k.0/24. The service CIDR is routed
# onto the same bridge, so a packet for either never has a route off this machine. Neither may
# contain the host's resolver.
bridge=noops0
bridge_mac=02:6e:6f:6f:70:73
pod_cidr=10.244.0.0/16
control_plane_ip=10.244.0.1
service_cidr=10.96.0.0/16
api_service_ip=10.96.0.1
cluster_domain=cluster.local
max_nodes=16
k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$root/tools/k8s/go.mod")

# Ports on this machine (etcd of the control plane on loopback, away from etcd's usual ports).
etcd_client_port=12379
etcd_peer_port=12380
apiserver_port=6443
kubelet_port=10250

# How fast Kubernetes reacts to a node that stops answering (the upstream defaults are for real
# machines: 40 s lease, 50 s grace, 300 s tolerations). A node agent renews its Lease every
# lease/4 seconds; the node lifecycle controller marks a node NotReady after the grace period;
# pods are evicted from a NotReady or unreachable node after the toleration.
node_lease_seconds=8
node_monitor_grace_seconds=10
eviction_toleration_seconds=10
# How often a node writes its pods' ConfigMap, Secret and token files again (the kubelet's
# --sync-frequency, 1 minute upstream): a renewed certificate reaches its pods within this.
node_sync_seconds=10

target_dir=${CARGO_TARGET_DIR:-$root/target}
node_agent_bin="$target_dir/debug/noops-node"

# Which nodes the cluster runs: `agent` (our node agent plays kubelet; the default) or `kubelet`
# (real nodes: the upstream kubelet with containerd, hack/real-node.sh). Chosen by NODE_KIND when
# the cluster is made, then kept for its life (node faults start a node of the same kind).
node_kind() {
  if [ -f "$cluster/run/node-kind" ]; then cat "$cluster/run/node-kind"; else echo "${NODE_KIND:-agent}"; fi
}

# use_node_kind <agent|kubelet>: stops a cluster of the other kind (its state goes with it), so
# that cluster-up then starts one of this kind: for what needs one kind (the demo's and tests'
# tenant machines need node agents, `make e2e` switches between both).
use_node_kind() {
  [ -f "$cluster/run/node-kind" ] || return 0
  local running
  running=$(cat "$cluster/run/node-kind")
  [ "$running" != "$1" ] || return 0
  log "stopping the local Kubernetes of $running nodes: this needs $1 nodes"
  "$root/hack/cluster-down.sh"
}

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }
# free_mib <dir>: the space left on dir's filesystem, in MiB.
free_mib() { df --output=avail -m "$1" | tail -1 | tr -d ' '; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# --- nodes -------------------------------------------------------------------------------------
# node_index <name or number>: the number k of node `noops-node-k`.
node_index() {
  local k=${1#noops-node-}
  [[ $k =~ ^[0-9]+$ ]] && [ "$k" -ge 1 ] && [ "$k" -le "$max_nodes" ] || die "no such node: $1 (nodes are noops-node-1 .. noops-node-$max_nodes, or 1 .. $max_nodes)"
  echo "$((10#$k))"
}
node_name() { echo "noops-node-$1"; }
node_ip() { echo "10.244.$1.1"; }
node_pod_cidr() { echo "10.244.$1.0/24"; }
node_dir() { echo "$cluster/nodes/$(node_name "$1")"; }
# node_zone <k> <nodes> <zones>: the zone of node k when a cluster's nodes are split, in order,
# into that many zones (cluster-up's NODE_ZONES): zone-1 holds the first nodes.
node_zone() { echo "zone-$(( ($1 - 1) * $3 / $2 + 1 ))"; }
zone_label=topology.kubernetes.io/zone
# The nodes this cluster has (made by cluster-up, running or not), by number.
existing_nodes() {
  local d
  for d in "$cluster"/nodes/noops-node-*; do [ -d "$d" ] && echo "${d##*-}"; done | sort -n
}

# A cgroup (v2) per node holds its agent and every process of its pods, so that the machine can
# die at once. Empty when this machine has no cgroup v2 hierarchy (then pids are used instead).
cgroup2_root() { findmnt -rn -t cgroup2 -o TARGET 2>/dev/null | head -1; }
node_cgroup() {
  local r
  r=$(cgroup2_root)
  [ -n "$r" ] && echo "$r/noops/$(node_name "$1")"
  true
}

# --- processes ---------------------------------------------------------------------------------
# alive <name>: whether the component started under that name is still running.
alive() {
  local pidfile="$run/$1.pid"
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

# launch <name> <command...>: starts a component in its own session, logging to logs/<name>.log.
launch() {
  local name=$1; shift
  if alive "$name"; then return; fi
  [ -f "$logs/$name.log" ] && mv "$logs/$name.log" "$logs/$name.previous.log"
  setsid "$@" >"$logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$run/$name.pid"
}

# wait_for <what> <seconds> <command...>
wait_for() {
  [ -n "${NOOPS_TRACE:-}" ] && log "waiting for $1"
  local what=$1 limit=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "$what did not come up within ${limit}s (logs: $logs)"
    sleep 0.1
  done
}

# The interface of the default route (the way off this machine), if there is one.
outward_interface() { ip -4 route show default | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }'; }

kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

# start_node <k>: starts node k (its certificates and kubeconfig exist), of the cluster's kind.
# An agent node: its address goes on the bridge first; the agent runs in the node's cgroup.
start_node() {
  local k=$1 name ip dir cg
  name=$(node_name "$k"); ip=$(node_ip "$k"); dir=$(node_dir "$k")
  if [ "$(node_kind)" = kubelet ]; then start_real_node "$k"; return; fi
  alive "$name" && return
  mkdir -p "$dir/state" "$dir/volumes"
  ip addr replace "$ip/32" dev "$bridge"
  local agent=(env NOOPS_ROOT="$root" NOOPS_BIN="$bin" NOOPS_TARGET="$target_dir" RUST_LOG="${RUST_LOG:-info}"
    "$node_agent_bin" --kubeconfig "$dir/kubeconfig" --node-name "$name"
    --node-ip "$ip" --pod-cidr "$(node_pod_cidr "$k")" --cluster-cidr "$pod_cidr" --bridge "$bridge"
    --cluster-domain "$cluster_domain" --state-dir "$dir/state" --volumes-dir "$dir/volumes"
    --images "$root/cluster/images.yaml" --kubernetes-version "$k8s_version" --api-service "$api_service_ip:443"
    --kubelet-port "$kubelet_port" --tls-cert "$pki/$name-serving.crt" --tls-key "$pki/$name-serving.key"
    --client-ca "$pki/kubelet-client-ca.crt" --node-lease-seconds "$node_lease_seconds"
    --sync-frequency-seconds "$node_sync_seconds"
    --private-path "$cluster" --private-path "$kubeconfig")
  cg=$(node_cgroup "$k")
  if [ -n "$cg" ] && mkdir -p "$cg" 2>/dev/null; then
    # The shell moves itself into the cgroup, then becomes the agent.
    launch "$name" sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "${agent[@]}"
  else
    launch "$name" "${agent[@]}"
  fi
}

node_ready() { kubectl get node "$(node_name "$1")" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }

# kill_node <k>: the machine dies: its agent and every process of its pods end at once (no
# SIGTERM, no grace), and its pods' network namespaces disappear. Volumes stay on disk.
# Every step tolerates what is already gone (callers run under `set -e`).
kill_node() {
  local k=$1 name cg pid ns pidfile
  name=$(node_name "$k"); cg=$(node_cgroup "$k")
  if [ -n "$cg" ] && [ -d "$cg" ]; then
    echo 1 > "$cg/cgroup.kill" || true
    # cgroupfs files have no size: read them to see whether anything is left.
    for _ in $(seq 1 50); do [ -n "$(cat "$cg/cgroup.procs" 2>/dev/null)" ] || break; sleep 0.1; done
  fi
  # Without a cgroup (and as a safety net): the agent's session, the container process groups
  # the agent recorded, and anything left in the node's pod network namespaces.
  if [ -f "$run/$name.pid" ]; then kill -KILL -- "-$(cat "$run/$name.pid")" 2>/dev/null || true; fi
  for pidfile in "$(node_dir "$k")"/state/pods/*/pids/*; do
    [ -f "$pidfile" ] || continue
    kill -KILL -- "-$(awk '{ print $1 }' "$pidfile")" 2>/dev/null || true
  done
  for ns in $(ip netns list 2>/dev/null | awk -v p="$name-" 'index($1, p) == 1 { print $1 }'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip link del "nv${ns##*-}" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -f "$run/$name.pid"
  [ "$(node_kind)" != kubelet ] || kill_real_node_rest "$k"
}

# node_renewed_since <k> <unix seconds>: whether node k's agent has renewed its Lease since then
# (its Ready condition may still be the one from before a short outage).
node_renewed_since() {
  local renew
  renew=$(kubectl get lease -n kube-node-lease "$(node_name "$1")" -o jsonpath='{.spec.renewTime}' 2>/dev/null) || return 1
  [ -n "$renew" ] && [ "$(date -d "$renew" +%s)" -ge "$2" ]
}

# An operator left running in the cluster by `make demo` would reconcile test and benchmark
# objects too; tests and benchmarks run their own.
stop_demo_operator() { kubectl delete deployment -n noops-system noops-operator --ignore-not-found --wait=false >/dev/null 2>&1 || true; }

source "$root/hack/real-node.sh"
