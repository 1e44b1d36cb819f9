#!/usr/bin/env bash
# Node faults for the local Kubernetes, as tests and users inject them:
#
#   hack/node.sh list               the nodes, and whether each runs, is stopped or partitioned
#   hack/node.sh stop NODE          the machine dies: its agent and every process of its pods end
#                                   at once (SIGKILL, no grace) and its pod networks vanish
#   hack/node.sh start NODE         the machine comes back (a reboot): the agent restarts the pods
#                                   still bound to it, with their volumes
#   hack/node.sh partition NODE     cuts the node's agent and pods off from everything else on our
#                                   bridge (the API server, other nodes, this machine); processes
#                                   keep running
#   hack/node.sh heal NODE          undoes a partition
#   hack/node.sh restart-all        every node dies at once, then all come back
#
# NODE is a node name (noops-node-2) or its number (2). Kubernetes reacts as it would to a real
# machine: the Node goes NotReady after the grace period, then pods are evicted after their
# toleration (hack/lib.sh sets both short; see the README).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || die "node faults need root (cgroups, network namespaces, nftables)"
[ -d "$cluster/nodes" ] || die "the local Kubernetes is not up: run \`make cluster-up\`"

partitioned_file="$run/partitioned"
partitioned() { [ -f "$partitioned_file" ] && cat "$partitioned_file" || true; }

# The partition table is rebuilt from the list of partitioned nodes, in one nft transaction. For
# node k: packets between its pod range (which holds its address and its pods) and any other
# address are dropped wherever they pass (routed, bridged, to or from this machine), and so is
# the agent's own traffic to the API server and the API server's to it (both use the node's
# address on both ends). Only drops, only our own ranges: nothing is redirected anywhere.
apply_partitions() {
  local rules="" k cidr ip
  for k in $(partitioned); do
    cidr=$(node_pod_cidr "$k"); ip=$(node_ip "$k")
    rules+="    ip saddr $cidr ip daddr != $cidr drop"$'\n'
    rules+="    ip daddr $cidr ip saddr != $cidr drop"$'\n'
    rules+="    ip saddr $ip ip daddr $ip drop"$'\n'
  done
  local chains="" hook
  for hook in prerouting forward input output; do
    chains+="  chain $hook {"$'\n'"    type filter hook $hook priority 0; policy accept;"$'\n'"$rules  }"$'\n'
  done
  nft -f - <<NFT
table inet noops_partition {}
delete table inet noops_partition
table inet noops_partition {
$chains}
NFT
  [ -n "$(partitioned)" ] || nft delete table inet noops_partition
}

stop_node_now() {
  local k=$1
  alive "$(node_name "$k")" || log "$(node_name "$k") is not running"
  kill_node "$k"
}

case ${1:-} in
  list)
    printf '%-14s %-12s %-12s %s\n' NODE ADDRESS PODS STATE
    for k in $(existing_nodes); do
      s=stopped; alive "$(node_name "$k")" && s=running
      grep -qx "$k" <(partitioned) && s+=",partitioned"
      printf '%-14s %-12s %-12s %s\n' "$(node_name "$k")" "$(node_ip "$k")" "$(node_pod_cidr "$k")" "$s"
    done
    ;;
  stop)
    k=$(node_index "${2:?usage: node.sh stop NODE}")
    [ -d "$(node_dir "$k")" ] || die "$(node_name "$k") does not exist"
    stop_node_now "$k"
    log "$(node_name "$k") stopped: agent and pods killed, pod networks gone, volumes kept"
    ;;
  start)
    k=$(node_index "${2:?usage: node.sh start NODE}")
    [ -d "$(node_dir "$k")" ] || die "$(node_name "$k") does not exist"
    start_node "$k"
    wait_for "node $(node_name "$k")" 60 node_ready "$k"
    log "$(node_name "$k") is back and Ready"
    ;;
  partition)
    k=$(node_index "${2:?usage: node.sh partition NODE}")
    [ -d "$(node_dir "$k")" ] || die "$(node_name "$k") does not exist"
    { partitioned; echo "$k"; } | sort -nu > "$partitioned_file.new" && mv "$partitioned_file.new" "$partitioned_file"
    apply_partitions
    log "$(node_name "$k") partitioned: its agent and pods reach nothing outside $(node_pod_cidr "$k")"
    ;;
  heal)
    k=$(node_index "${2:?usage: node.sh heal NODE}")
    partitioned | grep -vx "$k" > "$partitioned_file.new" || true
    mv "$partitioned_file.new" "$partitioned_file"
    apply_partitions
    log "$(node_name "$k") healed"
    ;;
  restart-all)
    all=$(existing_nodes)
    for k in $all; do kill_node "$k" & done
    wait
    log "every node stopped; starting them again"
    for k in $all; do start_node "$k"; done
    for k in $all; do wait_for "node $(node_name "$k")" 60 node_ready "$k"; done
    log "every node is back and Ready"
    ;;
  *)
    sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
