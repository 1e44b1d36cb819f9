#!/usr/bin/env bash
# Benchmarks, printed as a Markdown table and appended to .noops/bench/results.md with the date and
# commit. Figures are for comparing runs on the same machine; it is noisy, so each is a median.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

runs=${BENCH_RUNS:-3}
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# Warm cluster-up: binaries built, cluster down, how long until every node is Ready and the
# default ServiceAccount exists; with one node and with three.
warm_up() {
  "$root/hack/cluster-down.sh" >/dev/null
  NODES=$1 "$root/hack/cluster-up.sh" | sed -E 's/.* is up in ([0-9.]+)s.*/\1/'
}
# Three nodes last: the operator benchmarks below run on them (a node is stopped in one).
up_times=()
for _ in $(seq 1 "$runs"); do up_times+=("$(warm_up 1)"); done
up_median=$(printf '%s\n' "${up_times[@]}" | median)
up3_times=()
for _ in $(seq 1 "$runs"); do up3_times+=("$(warm_up 3)"); done
up3_median=$(printf '%s\n' "${up3_times[@]}" | median)

# Pod start: from `kubectl apply` of a one-pod Deployment to Ready.
start_times=()
kubectl create namespace bench --dry-run=client -o yaml | kubectl apply -f - >/dev/null
for i in $(seq 1 "$runs"); do
  t0=$(date +%s.%N)
  kubectl create deployment -n bench "echo-$i" --image=hashicorp/http-echo -- http-echo -text=bench >/dev/null
  kubectl wait -n bench --for=condition=Available "deployment/echo-$i" --timeout=60s >/dev/null
  start_times+=("$(awk -v s="$t0" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }')")
done
kubectl delete namespace bench --wait=false >/dev/null
start_median=$(printf '%s\n' "${start_times[@]}" | median)

agent_rss=$(awk '/VmHWM/ { print $2 }' "/proc/$(cat "$run/$(node_name 1).pid")/status")

table=$(cat <<TABLE
| benchmark | median of $runs | runs |
|---|---|---|
| local Kubernetes warm \`cluster-up\`, 1 node (s) | $up_median | ${up_times[*]} |
| local Kubernetes warm \`cluster-up\`, 3 nodes (s) | $up3_median | ${up3_times[*]} |
| Deployment of 1 pod, apply → Available (s) | $start_median | ${start_times[*]} |
| node agent peak RSS (MiB) | $((agent_rss / 1024)) | |
TABLE
)
echo "$table"

# The MaintPage operator (release build), with 100 and 1000 objects.
log "building the operator in release mode for the MaintPage benchmark"
stop_demo_operator
(cd "$root" && cargo build --quiet --release -p noops && cargo build --quiet -p noops-e2e --bins)
operator_table=$("$target_dir/debug/maintpage-bench" "$target_dir/release/noops" ${BENCH_MAINTPAGES:-100 1000})
echo
echo "$operator_table"
table+=$'\n\n'"$operator_table"

# The EtcdCluster operator (release build): create, resize, replace a member, upgrade, against
# the budgets CoreOS's etcd-operator set itself in its own end-to-end tests.
etcd_table=$("$target_dir/debug/etcd-bench" "$target_dir/release/noops" "$runs")
echo
echo "$etcd_table"
table+=$'\n\n'"$etcd_table"

# The PostgreSQL operator (release build): create, restart, a lost volume (and the commits it
# cost), a base backup and a restore of a database over 200 MB, each beside what the
# PostgreSQL tools alone take.
pg_table=$("$target_dir/debug/pg-bench" "$target_dir/release/noops" "$runs")
echo
echo "$pg_table"
table+=$'\n\n'"$pg_table"
# PostgreSQL with replicas (release build): how long writes wait when the primary's pod is
# force-deleted or deleted and in a switchover, beside CloudNativePG's figures on this machine.
pg_ha_table=$("$target_dir/debug/pg-ha-bench" "$target_dir/release/noops" "$runs")
echo
echo "$pg_ha_table"
table+=$'\n\n'"$pg_ha_table"
# Hosted control planes (release build): apply → Ready and an upgrade of 3 API servers, beside
# the same binaries run by hand and Kamaji's published figures; how many fit on this machine.
kcp_table=$("$target_dir/debug/kcp-bench" "$target_dir/release/noops" "$runs")
echo
echo "$kcp_table"
table+=$'\n\n'"$kcp_table"
# Machines (release build): a MachineDeployment's machines joining, a rolling replacement, the
# memory of one; beside the VM pod's own start, the sum of the rollout's waits, CAPD's budgets.
machine_table=$("$target_dir/debug/machine-bench" "$target_dir/release/noops" "$runs")
echo
echo "$machine_table"
table+=$'\n\n'"$machine_table"
# Whole clusters (release build): one manifest to every Node Ready, an upgrade in order, a pod
# the autoscaler grows a pool for; beside the steps that bound each in the same run.
cluster_table=$("$target_dir/debug/cluster-bench" "$target_dir/release/noops" "$runs")
echo
echo "$cluster_table"
table+=$'\n\n'"$cluster_table"
mkdir -p "$state/bench"
{
  echo
  echo "## $(date -u +%Y-%m-%dT%H:%MZ) $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown) ($(nproc) cores)"
  echo
  echo "$table"
} >> "$state/bench/results.md"
