#!/usr/bin/env bash
# The demo's second part: one KubernetesCluster manifest (examples/kubernetes/cluster.yaml) makes a
# whole tenant cluster on the local Kubernetes: its control plane, then two pools of machines. An
# app runs in the tenant behind a load balancer; the cluster is upgraded from 1.33 to 1.34 (the
# control plane first, then each pool) while a client polls the app and counts failed requests.
# Run by demo.sh, after the operator is installed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

ns=demo-cluster
cluster=acme
# A re-run starts from a new cluster: the last one is at 1.34 and cannot be taken back.
if kubectl get namespace "$ns" >/dev/null 2>&1; then
  log "removing the cluster of the last demo (namespace $ns)"
  kubectl delete namespace "$ns" --timeout=300s >/dev/null
fi
kubectl create namespace "$ns" >/dev/null

log "applying examples/kubernetes/cluster.yaml: one manifest for a whole cluster"
kubectl apply -n "$ns" -f "$root/examples/kubernetes/cluster.yaml"
# The cluster's progress from its status (phase, versions, each pool), a line whenever it changes;
# a value the status does not hold yet says so rather than print nothing.
progress='{{with .status}}{{or .phase "Pending"}}: cluster at {{or .version "no version yet"}}'
progress+=', control plane {{or .controlPlane "not made yet"}}, nodes {{or .nodes "none yet"}}'
progress+='{{range .pools}}; pool {{.name}} {{or .updated 0}}/{{.desired}} at {{or .version "no version yet"}}'
progress+=' ({{or .ready 0}} ready){{end}}{{else}}no status yet{{end}}'
show_until() {
  local done_when=$1 limit=$2 last="" now deadline=$((SECONDS + $2))
  until eval "$done_when"; do
    now=$(kubectl get -n "$ns" kc "$cluster" -o go-template="$progress" 2>/dev/null || true)
    [ "$now" = "$last" ] || { log "$now"; last=$now; }
    [ $SECONDS -lt $deadline ] || die "the cluster did not get there within ${limit}s (kubectl get -n $ns kc,kcp,md,machines; operator logs: kubectl logs -n noops-system deployment/noops-operator)"
    sleep 2
  done
}
# Ready at version $1 (a prefix such as 1.33.), for the generation the spec is at.
cluster_at() {
  local line
  line=$(kubectl get -n "$ns" kc "$cluster" -o jsonpath='{.metadata.generation} {.status.observedGeneration} {.status.version} {.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) || return 1
  read -r generation observed version ready <<<"$line"
  [ "$generation" = "$observed" ] && [[ $version == "$1"* ]] && [ "$ready" = True ]
}
show_until 'cluster_at 1.33.' 600
kubectl get -n "$ns" kc,kcp,md,ms,machines

# The tenant, through the admin kubeconfig Secret its status names.
tenant_kubeconfig="$state/demo-tenant.kubeconfig"
secret=$(kubectl get -n "$ns" kc "$cluster" -o jsonpath='{.status.kubeconfigSecret}')
kubectl get -n "$ns" secret "$secret" -o jsonpath='{.data.kubeconfig}' | base64 -d >"$tenant_kubeconfig"
tenant() { "$bin/kubectl" --kubeconfig "$tenant_kubeconfig" "$@"; }
log "the tenant's nodes"
tenant get nodes

log "an app in the tenant (3 replicas, at most one down at a time), a load balancer in front of its machines"
tenant apply -f "$root/hack/demo-tenant-app.yaml" >/dev/null
tenant rollout status deployment/web --timeout=180s
sed "s/CLUSTER/$cluster/" "$root/hack/demo-load-balancer.yaml" | kubectl apply -n "$ns" -f - >/dev/null
address=$(kubectl get -n "$ns" service lb -o jsonpath='{.spec.clusterIP}')
deadline=$((SECONDS + 60))
until curl -sf --max-time 1 "http://$address/" >/dev/null; do
  [ $SECONDS -lt $deadline ] || die "the app did not answer through the load balancer ($address) within 60s"
  sleep 0.2
done
log "the app answers at http://$address/: $(curl -sf --max-time 1 "http://$address/")"

# The client: one request every 100 ms, each failure printed.
client_log=$(mktemp)
(
  ok=0 failed=0
  while [ ! -f "$client_log.stop" ]; do
    if curl -sf --max-time 2 "http://$address/" >/dev/null; then
      ok=$((ok + 1))
    else
      failed=$((failed + 1))
      printf '%s client: request FAILED\n' "$(date +%H:%M:%S)"
    fi
    sleep 0.1
  done
  echo "$ok $failed" >"$client_log"
) &
client=$!

log "upgrading the cluster to 1.34: the control plane first, then pool general, then pool burst"
kubectl patch -n "$ns" kc "$cluster" --type merge -p '{"spec":{"version":"1.34"}}' >/dev/null
show_until 'cluster_at 1.34.' 900
touch "$client_log.stop"
wait "$client"
read -r ok failed <"$client_log"
rm -f "$client_log" "$client_log.stop"

kubectl get -n "$ns" kc,kcp,md,ms,machines
log "the tenant's nodes after the upgrade"
tenant get nodes
log "the upgrade's steps, in the order they finished: $(kubectl get -n "$ns" kc "$cluster" -o jsonpath='{.status.upgrade.finished}')"
log "what the operator said (Events of the KubernetesCluster):"
kubectl get events -n "$ns" --field-selector involvedObject.kind=KubernetesCluster --sort-by=.lastTimestamp \
  -o custom-columns=REASON:.reason,MESSAGE:.message
log "client during the upgrade: $ok requests answered, $failed failed"
log "the tenant stays up: KUBECONFIG=$tenant_kubeconfig kubectl get nodes"
[ "$failed" -eq 0 ]
