#!/usr/bin/env bash
# Stops the local Kubernetes and removes what it made: every process it started (and every pod
# process), pod network namespaces and veths, the bridge and its routes, the safety rules and
# kube-proxy's rules, saved sysctls, and the cluster state. Logs stay in .noops/logs.
# Idempotent: safe to run when nothing is up.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

# stop <name> [grace seconds]: TERM, wait, then KILL the component's whole session.
stop() {
  local name=$1 grace=${2:-10} pid
  [ -f "$run/$name.pid" ] || return 0
  pid=$(cat "$run/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 $((grace * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$run/$name.pid"
}

# Node agents stop their pods on TERM (all at once), kubelets do not; whatever is left of them
# (a real node's containerd and containers too) is killed below.
for k in $(existing_nodes); do stop "$(node_name "$k")" 15 & done
stop noops-node 15 &  # the single agent of clusters made before nodes had numbers
wait
for k in $(existing_nodes); do kill_node "$k"; done
stop kube-proxy
stop kube-scheduler
stop kube-controller-manager
stop kube-apiserver
stop etcd

# Pod processes left behind (an agent that was killed hard) are found by their network namespace.
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^noops-/ { print $1 }'); do
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
done
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^noops-/ { print $1 }'); do ip netns del "$ns" 2>/dev/null || true; done
for link in $(ip -o link show 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1 | grep '^nv' || true); do
  ip link del "$link" 2>/dev/null || true
done

# kube-proxy's own cleanup removes most of its chains; KUBE-FIREWALL and friends are left, so
# every remaining KUBE- rule and chain goes too (other rules are restored as they were).
[ -x "$bin/kube-proxy" ] && "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
for family in iptables ip6tables; do
  if command -v "$family-save" >/dev/null && "$family-save" 2>/dev/null | grep -q KUBE-; then
    "$family-save" | grep -v -- 'KUBE-' | "$family-restore" 2>/dev/null || true
  fi
done
ip route del "$service_cidr" 2>/dev/null || true
ip link del "$bridge" 2>/dev/null || true
nft delete table inet noops_safety 2>/dev/null || true
nft delete table inet noops_partition 2>/dev/null || true
nft delete table bridge noops_partition 2>/dev/null || true
cg=$(cgroup2_root)
if [ -n "$cg" ] && [ -d "$cg/noops" ]; then
  for d in "$cg"/noops/*/; do
    [ -d "$d" ] || continue
    # Killed processes leave the cgroup a moment later; it can only go once empty.
    for _ in $(seq 1 50); do rmdir "$d" 2>/dev/null && break; sleep 0.1; done
  done
  rmdir "$cg/noops" 2>/dev/null || true
fi
# Real nodes' cgroup roots (v1): the kubelet's folders inside them go first.
for h in $(cgroup_v1_roots); do
  [ -d "$h/noops" ] || continue
  for _ in $(seq 1 50); do find "$h/noops" -depth -type d -exec rmdir {} \; 2>/dev/null; [ -d "$h/noops" ] || break; sleep 0.1; done
done
rmdir /run/noops 2>/dev/null || true
if [ -f "$run/sysctl.saved" ]; then
  while IFS= read -r line; do sysctl -qw "$line" 2>/dev/null || true; done < "$run/sysctl.saved"
fi

# Mounts of pod volumes live in the pods' own mount namespaces, which died with them; the state
# can go. Built binaries and logs stay.
rm -rf "$cluster" "$kubeconfig"
log "local Kubernetes is down"
