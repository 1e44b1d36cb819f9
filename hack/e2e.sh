#!/usr/bin/env bash
# The end-to-end tests of `make e2e`, on the node kind each needs (docs/local-kubernetes.md):
#   1. node agents: every test binary but those real nodes run, 4 at a time (2 with tenant
#      clusters); then their node faults and the loosened schema, alone.
#   2. real nodes (the upstream kubelet with containerd, images built here): the etcd,
#      PostgreSQL, MaintPage and plugin tests with their operators installed by the Helm chart
#      from the image, and `kubectl exec/cp/logs -f/port-forward`, 3 at a time; then the node
#      faults of etcd and PostgreSQL, alone.
# Tenant clusters (KubernetesCluster machines, hosted control planes) run this machine's
# programs, which only the node agent can: their tests stay on it.
#
# usage: hack/e2e.sh [agent|real]...   (both when none is named)
set -euo pipefail
# Read whole before it runs (the braces, closed by `exit`): an edit during a long run cannot
# change what the running copy does next.
{
source "$(dirname "$0")/lib.sh"
cd "$root"

# The binaries real nodes run: none of them makes a tenant cluster.
real_binaries=(real_nodes etcd etcd_backup postgres postgres_backup maintpage plugin)
# The node faults real nodes run (substrings of test names): every one of etcd and PostgreSQL.
# A stopped node's pods moving with their volumes is the kubelet's and the runtime's part of it.
real_faults=(etcd postgresql base_backup repeated_primary a_stopped_node)

nodes=${E2E_NODES:-3}
phases=("$@")
((${#phases[@]})) || phases=(agent real)

# use_nodes <agent|kubelet>: a cluster of E2E_NODES nodes of that kind, stopping one of the other.
use_nodes() {
  local kind=$1
  use_node_kind "$kind"
  # Real nodes need their runtime and images (setup builds them only when asked).
  [ "$kind" = agent ] || NODE_KIND=$kind hack/setup.sh
  NODE_KIND=$kind NODES=$nodes hack/cluster-up.sh
  stop_demo_operator
}

skips=()
onlys=()
for fault in "${real_faults[@]}"; do skips+=(--skip "$fault"); onlys+=(--only "$fault"); done
tests=()
for binary in "${real_binaries[@]}"; do tests+=(--test "$binary"); done
real_regex=$(IFS='|'; echo "${real_binaries[*]}")

for phase in "${phases[@]}"; do
  case $phase in
    agent)
      use_nodes agent
      hack/e2e-run.sh --jobs 4 --heavy 'clusters|cluster_lifecycle|machines' --heavy-jobs 2 \
        --except "$real_regex" -- -p noops-e2e -p noops-sample-operator --test '*'
      hack/e2e-run.sh --jobs 1 --ignored "${skips[@]}" -- -p noops-e2e --test node_faults --test maintpage_malformed
      ;;
    real)
      use_nodes kubelet
      hack/e2e-run.sh --jobs 3 --include-ignored -- -p noops-e2e "${tests[@]}"
      hack/e2e-run.sh --jobs 1 --ignored "${onlys[@]}" -- -p noops-e2e --test node_faults
      ;;
    *) die "e2e: unknown phase $phase (agent or real)" ;;
  esac
done
exit
}
