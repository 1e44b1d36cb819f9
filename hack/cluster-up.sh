#!/usr/bin/env bash
# Starts the local Kubernetes: network (bridge, routes, safety rules), PKI, etcd, kube-apiserver,
# controller-manager, scheduler, kube-proxy and NODES node agents (default 1, at most 16), split
# into NODE_ZONES zones (default 1: no zone label). Returns when every node is Ready and the
# default ServiceAccount exists. Idempotent: running components are left alone, and a cluster
# with fewer nodes gets the missing ones.
# Expects the binaries to be built (`make setup` does that).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

start_time=$(date +%s.%N)
nodes=${NODES:-1}
[[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le "$max_nodes" ] || die "NODES=$nodes: choose 1 to $max_nodes"
zones=${NODE_ZONES:-1}
[[ $zones =~ ^[0-9]+$ ]] && [ "$zones" -ge 1 ] && [ "$zones" -le "$nodes" ] || die "NODE_ZONES=$zones: choose 1 to NODES ($nodes)"
[ "$(id -u)" = 0 ] || die "the local Kubernetes needs root (network namespaces, bridge, mounts)"
for b in etcd-3.6/etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl; do
  [ -x "$bin/$b" ] || die "$bin/$b is missing: run \`make setup\`"
done
[ -x "$node_agent_bin" ] || die "$node_agent_bin is missing: run \`make setup\`"
mkdir -p "$pki" "$run" "$logs" "$cluster/nodes" "$cluster/kubeconfigs"
# The node kind is the cluster's for its life.
[ -f "$run/node-kind" ] || echo "${NODE_KIND:-agent}" > "$run/node-kind"
kind=$(node_kind)
[ -z "${NODE_KIND:-}" ] || [ "$NODE_KIND" = "$kind" ] ||
  die "this cluster runs $kind nodes: \`make cluster-down\` first to start one with NODE_KIND=$NODE_KIND"
case $kind in
  agent) ;;
  kubelet)
    for b in "$kubelet_bin" "$containerd_bin" "$cni_bin_dir/bridge" "$images_dir/built.txt"; do
      [ -e "$b" ] || die "$b is missing: run \`NODE_KIND=kubelet make setup\`"
    done
    ;;
  *) rm -f "$run/node-kind"; die "NODE_KIND=$kind: choose agent (the node agent) or kubelet (real nodes)";;
esac

# --- network -------------------------------------------------------------------------------
# Everything that makes pod and service addresses local exists before any process starts.
setup_network() {
  local out resolver
  out=$(outward_interface || true)
  for resolver in $(awk '$1 == "nameserver" { print $2 }' /etc/resolv.conf); do
    case $resolver in 10.244.*|10.96.*) die "the host resolver $resolver lies inside the pod or service CIDR";; esac
  done
  if [ ! -f "$run/sysctl.saved" ]; then
    [ -e /proc/sys/net/bridge ] || modprobe br_netfilter 2>/dev/null || true
    {
      echo "net.ipv4.ip_forward=$(sysctl -n net.ipv4.ip_forward)"
      [ -e /proc/sys/net/bridge ] && echo "net.bridge.bridge-nf-call-iptables=$(sysctl -n net.bridge.bridge-nf-call-iptables)"
      echo "net.ipv4.conf.all.route_localnet=$(sysctl -n net.ipv4.conf.all.route_localnet)"
      # The kubelet of real nodes sets these machine-wide (its "kernel tunables").
      for tunable in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops; do
        echo "$tunable=$(sysctl -n "$tunable")"
      done
    } > "$run/sysctl.saved"
  fi
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
  fi
  # A bridge without an address of its own takes the lowest one of its ports, and changes it
  # when that pod goes: pods would then send to a gateway address nobody answers for (seen as
  # DNS queries left unanswered right after another pod was deleted).
  ip link set "$bridge" address "$bridge_mac"
  ip addr replace "$control_plane_ip/${pod_cidr#*/}" dev "$bridge"
  ip link set "$bridge" up
  ip route replace "$service_cidr" dev "$bridge" src "$control_plane_ip"
  # No packet for a pod or service address may leave by the outward interface; pods are never
  # forwarded anywhere but the bridge; our ports are not reachable from outside.
  local leave_rule="" expose_rule=""
  if [ -n "$out" ]; then
    leave_rule="oifname \"$out\" ip daddr { $pod_cidr, $service_cidr } reject"
    expose_rule="iifname \"$out\" tcp dport { $apiserver_port, $kubelet_port, 30000-32767 } drop"
  fi
  nft delete table inet noops_safety 2>/dev/null || true
  nft -f - <<EOF
table inet noops_safety {
  chain output {
    type filter hook output priority 0; policy accept;
    $leave_rule
  }
  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname "$bridge" oifname != "$bridge" drop
    oifname "$bridge" iifname != "$bridge" drop
  }
  chain input {
    type filter hook input priority 0; policy accept;
    $expose_rule
  }
}
EOF
  sysctl -qw net.ipv4.ip_forward=1
  [ -e /proc/sys/net/bridge ] && sysctl -qw net.bridge.bridge-nf-call-iptables=1
  true
}

# --- PKI -------------------------------------------------------------------------------------
# Two CAs: one signs serving certificates (apiserver, node agent), the other client certificates.
gen_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
gen_ca() {
  [ -f "$pki/$1.crt" ] && return
  gen_key "$pki/$1.key"
  openssl req -x509 -new -key "$pki/$1.key" -out "$pki/$1.crt" -days 3650 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
# gen_cert <name> <ca> <subject> <extendedKeyUsage> [subjectAltName]
gen_cert() {
  [ -f "$pki/$1.crt" ] && return
  gen_key "$pki/$1.key"
  openssl req -new -key "$pki/$1.key" -out "$pki/$1.csr" -subj "$3" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$4"
    [ -n "${5:-}" ] && echo "subjectAltName=$5"
  } > "$pki/$1.ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/$2.crt" -CAkey "$pki/$2.key" -CAcreateserial \
    -out "$pki/$1.crt" -days 3650 -extfile "$pki/$1.ext" 2>/dev/null
  rm -f "$pki/$1.csr" "$pki/$1.ext"
}
# kubeconfig <file> <client cert name> <server>
write_kubeconfig() {
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: noops
  cluster:
    server: $3
    certificate-authority-data: $(base64 -w0 < "$pki/serving-ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 < "$pki/$2.crt")
    client-key-data: $(base64 -w0 < "$pki/$2.key")
contexts:
- name: noops
  context: { cluster: noops, user: $2 }
current-context: noops
EOF
  chmod 600 "$1"
}
setup_pki() {
  gen_ca serving-ca "noops serving CA"
  gen_ca client-ca "noops client CA"
  # A CA of its own for the one client the node agents' kubelet API serves: the API server.
  # Certificates of the client CA (admin, components, the nodes) cannot read container logs.
  gen_ca kubelet-client-ca "noops kubelet client CA"
  # Each node agent reaches the API server at its own node address (so a partition can cut it
  # off): every possible node address is in the certificate.
  local api_sans="IP:127.0.0.1,IP:$control_plane_ip,IP:$api_service_ip,DNS:localhost,DNS:kubernetes" k
  api_sans+=",DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$cluster_domain"
  for k in $(seq 1 "$max_nodes"); do api_sans+=",IP:$(node_ip "$k")"; done
  # A certificate from before nodes had addresses of their own is replaced (the API server
  # reloads it).
  if [ -f "$pki/apiserver.crt" ] && ! openssl x509 -in "$pki/apiserver.crt" -noout -ext subjectAltName 2>/dev/null | grep -q "$(node_ip "$max_nodes")\b"; then
    rm -f "$pki/apiserver.crt"
  fi
  gen_cert apiserver serving-ca "/CN=kube-apiserver" serverAuth "$api_sans"
  gen_cert admin client-ca "/O=system:masters/CN=admin" clientAuth
  gen_cert apiserver-to-kubelet kubelet-client-ca "/CN=kube-apiserver-kubelet-client" clientAuth
  gen_cert controller-manager client-ca "/CN=system:kube-controller-manager" clientAuth
  gen_cert scheduler client-ca "/CN=system:kube-scheduler" clientAuth
  gen_cert kube-proxy client-ca "/CN=system:kube-proxy" clientAuth
  [ -f "$pki/service-account.key" ] || gen_key "$pki/service-account.key"
  [ -f "$pki/service-account.pub" ] || openssl pkey -in "$pki/service-account.key" -pubout -out "$pki/service-account.pub" 2>/dev/null
  local server="https://127.0.0.1:$apiserver_port"
  write_kubeconfig "$kubeconfig" admin "$server"
  for c in controller-manager scheduler kube-proxy; do
    write_kubeconfig "$cluster/kubeconfigs/$c" "$c" "$server"
  done
}
# setup_node_pki <k>: the node's serving certificate (kubelet API), its client certificate, and
# a kubeconfig that reaches the API server at the node's own address.
setup_node_pki() {
  local k=$1 name ip
  name=$(node_name "$k"); ip=$(node_ip "$k")
  mkdir -p "$(node_dir "$k")"
  gen_cert "$name-serving" serving-ca "/CN=system:node:$name" serverAuth "IP:$ip,DNS:$name"
  gen_cert "$name" client-ca "/O=system:nodes/CN=system:node:$name" clientAuth
  [ -f "$(node_dir "$k")/kubeconfig" ] || write_kubeconfig "$(node_dir "$k")/kubeconfig" "$name" "https://$ip:$apiserver_port"
}

# --- processes -------------------------------------------------------------------------------
api_get() { curl -sf --cacert "$pki/serving-ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "https://127.0.0.1:$apiserver_port$1"; }

setup_network
setup_pki

launch etcd "$bin/etcd-3.6/etcd" --name control-plane --data-dir "$cluster/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_client_port" --advertise-client-urls "http://127.0.0.1:$etcd_client_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "control-plane=http://127.0.0.1:$etcd_peer_port" --unsafe-no-fsync --log-level warn
wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_client_port/health"

launch kube-apiserver "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_client_port" \
  --bind-address 0.0.0.0 --secure-port "$apiserver_port" --advertise-address "$control_plane_ip" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/client-ca.crt" \
  --service-cluster-ip-range "$service_cidr" --allow-privileged=true \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction,PodNodeSelector \
  --service-account-issuer "https://kubernetes.default.svc.$cluster_domain" \
  --service-account-key-file "$pki/service-account.pub" --service-account-signing-key-file "$pki/service-account.key" \
  --kubelet-client-certificate "$pki/apiserver-to-kubelet.crt" --kubelet-client-key "$pki/apiserver-to-kubelet.key" \
  --kubelet-certificate-authority "$pki/serving-ca.crt" --kubelet-preferred-address-types InternalIP \
  --audit-policy-file "$root/cluster/audit-policy.yaml" --audit-log-path "$logs/audit.log" \
  --audit-log-maxsize 100 --audit-log-maxbackup 1 \
  --default-not-ready-toleration-seconds "$eviction_toleration_seconds" \
  --default-unreachable-toleration-seconds "$eviction_toleration_seconds" \
  --profiling=false --v 1
wait_for kube-apiserver 60 api_get /readyz

launch kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$cluster/kubeconfigs/controller-manager" \
  --authentication-kubeconfig "$cluster/kubeconfigs/controller-manager" --authorization-kubeconfig "$cluster/kubeconfigs/controller-manager" \
  --leader-elect=false --use-service-account-credentials \
  --service-account-private-key-file "$pki/service-account.key" --root-ca-file "$pki/serving-ca.crt" \
  --service-cluster-ip-range "$service_cidr" --bind-address 127.0.0.1 --profiling=false --v 1 \
  --kube-api-qps 200 --kube-api-burst 400 \
  --node-monitor-period 1s --node-monitor-grace-period "${node_monitor_grace_seconds}s"
launch kube-scheduler "$bin/kube-scheduler" --kubeconfig "$cluster/kubeconfigs/scheduler" \
  --authentication-kubeconfig "$cluster/kubeconfigs/scheduler" --authorization-kubeconfig "$cluster/kubeconfigs/scheduler" \
  --leader-elect=false --bind-address 127.0.0.1 --profiling=false --v 1
kubectl apply --server-side --force-conflicts -f "$root/cluster/addons.yaml" >/dev/null
launch kube-proxy "$bin/kube-proxy" --kubeconfig "$cluster/kubeconfigs/kube-proxy" \
  --hostname-override "$(node_name 1)" --proxy-mode iptables --cluster-cidr "$pod_cidr" \
  --nodeport-addresses "127.0.0.0/8,$control_plane_ip/32" --conntrack-max-per-core 0 \
  --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 --v 1
for k in $(seq 1 "$nodes"); do setup_node_pki "$k"; done
# The nodes start side by side: a real node's image import takes seconds each. Each new real
# node holds every image twice (layers, unpacked): room for all of them is checked first, as
# the imports side by side cannot each check for the others.
if [ "$kind" = kubelet ]; then
  new_nodes=0
  for k in $(seq 1 "$nodes"); do alive "$(node_name "$k")" || new_nodes=$((new_nodes + 1)); done
  need_mib=$(( $(du -sm "$images_dir" | cut -f1) * 2 * new_nodes + 256 ))
  [ "$new_nodes" = 0 ] || [ "$(free_mib "$cluster")" -ge "$need_mib" ] ||
    die "no room for $new_nodes real nodes' images: they need ${need_mib} MiB, $(free_mib "$cluster") MiB are free on $(df --output=target "$cluster" | tail -1)"
fi
starting=()
for k in $(seq 1 "$nodes"); do
  start_node "$k" &
  starting+=("$!")
done
for pid in "${starting[@]}"; do wait "$pid" || die "a node did not start (logs: $logs)"; done
for k in $(seq 1 "$nodes"); do wait_for "node $(node_name "$k")" 60 node_ready "$k"; done
# Zones (NODE_ZONES > 1): the nodes split in order, each labelled with its zone. A namespace
# annotated `scheduler.alpha.kubernetes.io/node-selector: topology.kubernetes.io/zone=zone-2`
# keeps its pods in that zone (the PodNodeSelector admission plugin), and the node lifecycle
# controller judges each zone's outage apart: node faults in one zone leave the other alone.
if [ "$zones" -gt 1 ]; then
  for k in $(seq 1 "$nodes"); do
    kubectl label node "$(node_name "$k")" --overwrite "$zone_label=$(node_zone "$k" "$nodes" "$zones")" >/dev/null
  done
fi
wait_for "the default ServiceAccount" 60 kubectl get serviceaccount default -n default
wait_for kube-proxy 30 curl -sf http://127.0.0.1:10256/healthz

elapsed=$(awk -v s="$start_time" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
running=$(kubectl get nodes --no-headers 2>/dev/null | wc -l)
printf 'local Kubernetes %s is up in %ss with %s node(s) (%s): export KUBECONFIG=%s (logs: %s)\n' "$k8s_version" "$elapsed" "$running" "$kind" "$kubeconfig" "$logs"
