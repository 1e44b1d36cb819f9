#!/usr/bin/env bash
# The demo: the noops operator running in the local Kubernetes switches a shop between its app
# and its maintenance page, while a client polls the shop's Service and counts failed requests;
# then an EtcdCluster and a PostgreSQL heal from a stopped node under a writing client each
# (tests/e2e/src/bin/demo-healing.rs); then one KubernetesCluster manifest makes a tenant
# cluster whose app answers through its upgrade (hack/demo-cluster.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

log "installing the noops CRDs, RBAC and operator (deploy/)"
kubectl apply --server-side --force-conflicts -f "$root/deploy/crds/" >/dev/null
kubectl apply -f "$root/deploy/00-namespace.yaml" -f "$root/deploy/10-rbac.yaml" -f "$root/deploy/20-operator.yaml" \
  -f "$root/deploy/30-metrics.yaml" >/dev/null
# The image runs the cargo build (cluster/images.yaml): a new build rolls the operator's pods.
build=$(stat -c %Y "$target_dir/debug/noops")
kubectl patch -n noops-system deployment/noops-operator --type merge \
  -p "{\"spec\":{\"template\":{\"metadata\":{\"annotations\":{\"noops.dev/build\":\"$build\"}}}}}" >/dev/null
kubectl rollout status -n noops-system deployment/noops-operator --timeout=120s
kubectl get pods -n noops-system -o wide

kubectl create namespace demo --dry-run=client -o yaml | kubectl apply -f - >/dev/null
log "applying examples/maintpage/shop.yaml"
kubectl apply -n demo -f "$root/examples/maintpage/shop.yaml"
# A re-run starts from the app side.
kubectl patch -n demo maintpage/shop --type merge -p '{"spec":{"maintenance":{"enabled":false}}}' >/dev/null
kubectl wait -n demo --for=condition=Ready maintpage/shop --timeout=120s >/dev/null
kubectl wait -n demo --for=jsonpath='{.status.published}'=app maintpage/shop --timeout=120s >/dev/null
kubectl get -n demo maintpage shop
service_ip=$(kubectl get service -n demo shop -o jsonpath='{.spec.clusterIP}')
# kube-proxy programs a new Service a moment after it exists.
until curl -sf --max-time 1 "http://$service_ip/" >/dev/null; do sleep 0.2; done

# The client: one request every 100 ms; prints the page whenever it changes.
client_log=$(mktemp)
(
  last="" ok=0 failed=0
  while [ ! -f "$client_log.stop" ]; do
    if page=$(curl -sf --max-time 1 "http://$service_ip/"); then
      ok=$((ok + 1))
      [ "$page" = "$last" ] || { printf '%s client: %s\n' "$(date +%H:%M:%S)" "$page"; last=$page; }
    else
      failed=$((failed + 1))
      printf '%s client: request FAILED\n' "$(date +%H:%M:%S)"
    fi
    sleep 0.1
  done
  echo "$ok $failed" > "$client_log"
) &
client=$!
sleep 2

log "maintenance on"
kubectl patch -n demo maintpage/shop --type merge -p '{"spec":{"maintenance":{"enabled":true}}}' >/dev/null
kubectl wait -n demo --for=jsonpath='{.status.published}'=maintenance maintpage/shop --timeout=120s >/dev/null
sleep 3
log "maintenance off"
kubectl patch -n demo maintpage/shop --type merge -p '{"spec":{"maintenance":{"enabled":false}}}' >/dev/null
kubectl wait -n demo --for=jsonpath='{.status.published}'=app maintpage/shop --timeout=120s >/dev/null
sleep 3
touch "$client_log.stop"
wait "$client"
read -r ok failed < "$client_log"
rm -f "$client_log" "$client_log.stop"

kubectl get -n demo maintpage shop
log "what the operator said (Events):"
kubectl get events -n demo --field-selector involvedObject.kind=MaintPage --sort-by=.lastTimestamp \
  -o custom-columns=REASON:.reason,MESSAGE:.message
log "client: $ok requests answered, $failed failed"
[ "$failed" -eq 0 ] || die "the shop's client saw $failed failed requests"

# Stateful services that heal: an EtcdCluster and a PostgreSQL under a client each, a node
# stopped; it prints the acknowledged writes lost and fails beyond their bounds.
log "an EtcdCluster and a PostgreSQL heal from a stopped node (namespace demo-healing)"
"$target_dir/debug/demo-healing"

"$root/hack/demo-cluster.sh"
log "demo done; the local Kubernetes stays up (KUBECONFIG=$kubeconfig). \`make cluster-down\` stops it."
