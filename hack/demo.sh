#!/usr/bin/env bash
# The demo: a workload on the local Kubernetes, reached through its Service from this machine.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

log "nodes:"
kubectl get nodes -o wide
kubectl create namespace demo --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -n demo -f "$root/examples/local/echo.yaml"
kubectl rollout status -n demo deployment/echo --timeout=120s
kubectl get pods -n demo -o wide
cluster_ip=$(kubectl get service -n demo echo -o jsonpath='{.spec.clusterIP}')
log "asking the Service (ClusterIP $cluster_ip) six times; kube-proxy spreads the requests:"
for _ in 1 2 3 4 5 6; do
  until curl -sf --max-time 2 "http://$cluster_ip/"; do sleep 0.3; done
done
log "and through the NodePort on 127.0.0.1:30080:"
until curl -sf --max-time 2 http://127.0.0.1:30080/; do sleep 0.3; done
log "logs of one pod (kubectl logs, served by the node agent):"
kubectl logs -n demo deployment/echo
log "demo done; the cluster stays up (KUBECONFIG=$kubeconfig). \`make cluster-down\` stops it."
