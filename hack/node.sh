#!/usr/bin/env bash
# Node faults for the local Kubernetes, as tests and users inject them:
#
#   hack/node.sh list               the nodes, and whether each runs, is stopped or partitioned
#   hack/node.sh stop NODE          the machine dies: its agent and every process of its pods end
#                                   at once (SIGKILL, no grace) and its pod networks vanish
#   hack/node.sh start NODE         the machine comes back (a reboot): the agent restarts the pods
#                                   still bound to it, with their volumes
#   hack/node.sh partition NODE     cuts the node's agent and pods off from everything else on our
#                                   bridge (the API server, other nodes, this machine; the node's
#                                   own DNS stays); processes keep running
#   hack/node.sh heal NODE          undoes a partition
#   hack/node.sh restart-all        every node dies at once, then all come back
#   hack/node.sh restore            undoes every fault: heals every partition, starts every
#                                   stopped node, and waits until all are Ready
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
  local rules="" between="" k cidr ip cut
  for k in $(partitioned); do
    cidr=$(node_pod_cidr "$k"); ip=$(node_ip "$k")
    cut="    ip saddr $cidr ip daddr != $cidr drop"$'\n'"    ip daddr $cidr ip saddr != $cidr drop"$'\n'
    between+="$cut"
    rules+="$cut"
    rules+="    ip saddr $ip ip daddr $ip drop"$'\n'
    # On the node's own address its pods reach only its DNS: the API server and everything else
    # this machine serves there are out of reach, as across a partition. (Replies to the
    # agent's probes are not new connections, and pass.)
    rules+="    ip saddr $cidr ip daddr $ip meta l4proto { tcp, udp } th dport != 53 ct state new drop"$'\n'
  done
  local chains="" hook
  for hook in prerouting forward input output; do
    chains+="  chain $hook {"$'\n'"    type filter hook $hook priority 0; policy accept;"$'\n'"$rules  }"$'\n'
  done
  # Pods of different nodes share the bridge: their packets are switched, not routed, and the
  # inet hooks see them only through br_netfilter. The bridge family sees them always.
  local bridged="  chain forward {"$'\n'"    type filter hook forward priority 0; policy accept;"$'\n'"$between  }"$'\n'
  nft -f - <<NFT
table inet noops_partition {}
delete table inet noops_partition
table inet noops_partition {
$chains}
table bridge noops_partition {}
delete table bridge noops_partition
table bridge noops_partition {
$bridged}
NFT
  if [ -z "$(partitioned)" ]; then
    nft delete table inet noops_partition
    nft delete table bridge noops_partition
  fi
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
    since=$(date +%s)
    start_node "$k"
    wait_for "node $(node_name "$k") to renew its lease" 60 node_renewed_since "$k" "$since"
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
    since=$(date +%s)
    for k in $all; do start_node "$k"; done
    for k in $all; do wait_for "node $(node_name "$k") to renew its lease" 60 node_renewed_since "$k" "$since"; done
    for k in $all; do wait_for "node $(node_name "$k")" 60 node_ready "$k"; done
    log "every node is back and Ready"
    ;;
  restore)
    : > "$partitioned_file"
    apply_partitions
    all=$(existing_nodes)
    since=$(date +%s)
    for k in $all; do alive "$(node_name "$k")" || start_node "$k"; done
    for k in $all; do wait_for "node $(node_name "$k") to renew its lease" 60 node_renewed_since "$k" "$since"; done
    for k in $all; do wait_for "node $(node_name "$k")" 60 node_ready "$k"; done
    log "every node is running, connected and Ready"
    ;;
  *)
    sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
