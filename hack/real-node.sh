# Real nodes of the local Kubernetes (NODE_KIND=kubelet): the upstream kubelet with containerd,
# runc and the CNI bridge plugin, one of each per node, beside a node agent that serves only what
# the local Kubernetes adds (cluster DNS at the node's address, local-path volumes, the built
# images as a registry, the refusal of other pulls). Sourced by lib.sh, not run.
#
# Every node shares this machine's network namespace, as the node agent's nodes do: its address
# (10.244.k.1) sits on the bridge, its pods are veths on the same bridge with addresses from
# 10.244.k.0/24, and the one kube-proxy of the machine serves them all. What is per node: the
# containerd root, state and socket, runc's root, the kubelet's root, pod logs and ports (on the
# node's address), the CNI address allocations, and a cgroup that holds all of it, so that a node
# dies at once.
# shellcheck shell=bash

kubelet_bin="$bin/kubelet"
# Debian's containerd (1.6), runc and CNI plugins: see docs/local-kubernetes.md for why.
containerd_bin=/usr/bin/containerd
ctr_bin=/usr/bin/ctr
cni_bin_dir=/usr/lib/cni
# The node agent's registry of the built images, every registry's mirror in containerd, and the
# refusal of what it does not hold, containerd's proxy (REGISTRY_PORT and PULL_REFUSAL_PORT in
# crates/node-agent), on the node's address.
registry_port=5000
pull_refusal_port=5001
# Image tarballs setup builds (hack/images.sh) and the list of their names.
images_dir="$state/images"
# The pause image of Kubernetes 1.34 (build/pause in its source, from which hack/images.sh builds it).
pause_image=registry.k8s.io/pause:3.10.1

# Sockets have a short length limit: they live under /run, not under the checkout.
real_node_run() { echo "/run/noops/$(node_name "$1")"; }

# The cgroup v1 hierarchies this machine mounts (cpu, memory, ...), each with a folder per node
# that the kubelet uses as its cgroup root.
cgroup_v1_roots() { findmnt -rn -t cgroup -o TARGET 2>/dev/null; }
real_node_cgroup_v1() { echo "noops/$(node_name "$1")"; }

# make_cgroup_v1_root <k>: the node's folder in every v1 hierarchy (the kubelet refuses a cgroup
# root that is missing in one). A new cpuset folder starts with no CPUs: give it its parent's.
make_cgroup_v1_root() {
  local k=$1 h path parent
  for h in $(cgroup_v1_roots); do
    for path in noops "$(real_node_cgroup_v1 "$k")"; do
      mkdir -p "$h/$path"
      if [ -f "$h/$path/cpuset.cpus" ]; then
        parent=$(dirname "$h/$path")
        [ -n "$(cat "$h/$path/cpuset.cpus")" ] || cat "$parent/cpuset.cpus" > "$h/$path/cpuset.cpus"
        [ -n "$(cat "$h/$path/cpuset.mems")" ] || cat "$parent/cpuset.mems" > "$h/$path/cpuset.mems"
      fi
    done
  done
}

write_containerd_config() {
  local k=$1 dir run_dir
  dir=$(node_dir "$k"); run_dir=$(real_node_run "$k")
  cat > "$dir/containerd.toml" <<EOF
# containerd of $(node_name "$k"), written by hack/real-node.sh.
version = 2
root = "$dir/containerd"
state = "$run_dir/containerd"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "$run_dir/containerd.sock"
[ttrpc]
  address = "$run_dir/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  # The sandbox asks for oom_score_adj -998, which needs CAP_SYS_RESOURCE; this machine's root
  # lacks it (runc then fails with "can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  # exec, attach and port-forward go through the kubelet, which reaches this on loopback.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$run_dir/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_bin_dir"
    conf_dir = "$dir/cni"
    max_conf_num = 1
  # Every registry's mirror is the node's registry of the images built here; what it does not
  # hold goes on to the registry itself, through the proxy that refuses it.
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."*"]
    endpoint = ["http://$(node_ip "$k"):$registry_port"]
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
    endpoint = ["http://$(node_ip "$k"):$registry_port"]
EOF
}

# The pods of node k are veths on the shared bridge with addresses from 10.244.k.0/24, the whole
# cluster network on their link and the node's address as their gateway, as the node agent's
# pods have. No masquerading: nothing leaves this machine.
write_cni_config() {
  local k=$1 dir
  dir=$(node_dir "$k")
  mkdir -p "$dir/cni" "$dir/cni-ipam"
  cat > "$dir/cni/10-noops.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "noops",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": false,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni-ipam",
        "ranges": [[{ "subnet": "$pod_cidr", "rangeStart": "10.244.$k.2", "rangeEnd": "10.244.$k.254", "gateway": "$(node_ip "$k")" }]],
        "routes": [{ "dst": "0.0.0.0/0", "gw": "$(node_ip "$k")" }]
      }
    }
  ]
}
EOF
}

write_kubelet_config() {
  local k=$1 dir ip
  dir=$(node_dir "$k"); ip=$(node_ip "$k")
  cat > "$dir/kubelet.yaml" <<EOF
# The kubelet of $(node_name "$k"), written by hack/real-node.sh.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: $ip
healthzPort: 10248
tlsCertFile: $pki/$(node_name "$k")-serving.crt
tlsPrivateKeyFile: $pki/$(node_name "$k")-serving.key
# Only the API server calls the kubelet, with a certificate of its own CA.
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: false }
  x509: { clientCAFile: $pki/kubelet-client-ca.crt }
authorization: { mode: AlwaysAllow }
containerRuntimeEndpoint: unix://$(real_node_run "$k")/containerd.sock
# No systemd here: plain cgroupfs, under the node's own cgroup.
cgroupDriver: cgroupfs
cgroupRoot: /$(real_node_cgroup_v1 "$k")
clusterDNS: [$ip]
clusterDomain: $cluster_domain
podLogsDir: $dir/pod-logs
failSwapOn: false
# A dead node is noticed in seconds (hack/lib.sh): the Lease lasts $node_lease_seconds s, renewed every quarter.
nodeLeaseDurationSeconds: $node_lease_seconds
nodeStatusUpdateFrequency: 2s
syncFrequency: ${node_sync_seconds}s
# Every node sees the whole machine's disk and memory: evict only when it is truly short, and
# never collect images (containerd 1.6 does not pin the pause image; the rest would only be
# imported again).
evictionHard: { memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1% }
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
EOF
}

# import_images <k>: every image tarball setup built goes into the node's containerd, once per
# tarball (the stamp records what was imported).
import_images() {
  local k=$1 dir tarball stamp need_mib
  dir=$(node_dir "$k")
  mkdir -p "$dir/imported"
  for tarball in "$images_dir"/*.tar; do
    [ -f "$tarball" ] || continue
    stamp="$dir/imported/$(basename "$tarball").$(stat -c %Y "$tarball")"
    [ -f "$stamp" ] && continue
    # containerd keeps the layers and their unpacked copy: twice the tarball, and some room.
    need_mib=$(($(stat -c %s "$tarball") * 2 / 1048576 + 256))
    [ "$(free_mib "$dir")" -ge "$need_mib" ] ||
      die "no room to import $(basename "$tarball") into $(node_name "$k")'s containerd: it needs ${need_mib} MiB, $(free_mib "$dir") MiB are free on $(df --output=target "$dir" | tail -1) (each real node holds every image built here, about $(($(du -sm "$images_dir" | cut -f1) * 2)) MiB)"
    "$ctr_bin" --address "$(real_node_run "$k")/containerd.sock" -n k8s.io images import "$tarball" >/dev/null ||
      die "importing $tarball into $(node_name "$k")'s containerd failed ($(free_mib "$dir") MiB free)"
    rm -f "$dir/imported/$(basename "$tarball")".*
    touch "$stamp"
  done
}

# launch_in_node <k> <name> <command...>: launches a component of node k inside its cgroup (v2,
# where the machine has one: `kill_node` kills it whole), else as a plain session.
launch_in_node() {
  local k=$1 name=$2 cg; shift 2
  cg=$(node_cgroup "$k")
  if [ -n "$cg" ] && mkdir -p "$cg" 2>/dev/null; then
    launch "$name" sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"
  else
    launch "$name" "$@"
  fi
}

# start_real_node <k>: containerd, the node agent's services and the kubelet of node k. A node
# already running takes the images setup rebuilt since (its registry reads them again itself).
start_real_node() {
  local k=$1 name ip dir run_dir
  name=$(node_name "$k"); ip=$(node_ip "$k"); dir=$(node_dir "$k"); run_dir=$(real_node_run "$k")
  if alive "$name"; then import_images "$k"; return; fi
  [ -x "$kubelet_bin" ] || die "$kubelet_bin is missing: run \`NODE_KIND=kubelet make setup\`"
  [ -x "$containerd_bin" ] || die "$containerd_bin is missing: run \`NODE_KIND=kubelet make setup\`"
  mkdir -p "$dir/volumes" "$dir/kubelet" "$dir/pod-logs" "$run_dir"
  ip addr replace "$ip/32" dev "$bridge"
  make_cgroup_v1_root "$k"
  write_containerd_config "$k"
  write_cni_config "$k"
  write_kubelet_config "$k"
  # Pulls go to the node's own registry, then to the refusal: no pull ever leaves this machine.
  launch_in_node "$k" "$name-services" env RUST_LOG="${RUST_LOG:-info}" "$node_agent_bin" --beside-kubelet \
    --kubeconfig "$dir/kubeconfig" --node-name "$name" --node-ip "$ip" --cluster-domain "$cluster_domain" \
    --volumes-dir "$dir/volumes" --images-dir "$images_dir"
  launch_in_node "$k" "$name-containerd" env HTTPS_PROXY="http://$ip:$pull_refusal_port" \
    HTTP_PROXY="http://$ip:$pull_refusal_port" NO_PROXY="$ip" "$containerd_bin" --config "$dir/containerd.toml"
  wait_for "$name's containerd" 30 "$ctr_bin" --address "$run_dir/containerd.sock" version
  import_images "$k"
  launch_in_node "$k" "$name" "$kubelet_bin" --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubeconfig" \
    --root-dir "$dir/kubelet" --hostname-override "$name" --node-ip "$ip" --v 1
}

# kill_real_node_rest <k>: after the node's processes are killed, what a reboot would take with
# them: its pods' network namespaces (found by address), the mounts of its kubelet and
# containerd, and the runtime state under /run.
kill_real_node_rest() {
  local k=$1 name ns pid prefix mnt
  name=$(node_name "$k"); prefix="10.244.$k."
  for component in "$name-containerd" "$name-services"; do
    if [ -f "$run/$component.pid" ]; then kill -KILL -- "-$(cat "$run/$component.pid")" 2>/dev/null || true; fi
    rm -f "$run/$component.pid"
  done
  # Container processes live in the kubelet's cgroups (v1), not in its session.
  local h procs
  for h in $(cgroup_v1_roots); do
    [ -d "$h/$(real_node_cgroup_v1 "$k")" ] || continue
    procs=$(find "$h/$(real_node_cgroup_v1 "$k")" -name cgroup.procs -exec cat {} + 2>/dev/null || true)
    [ -z "$procs" ] || kill -KILL $procs 2>/dev/null || true
    break
  done
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ { print $1 }'); do
    ip -n "$ns" -4 -o addr show 2>/dev/null | awk '{ print $4 }' | grep -q "^${prefix//./\\.}" || continue
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip -n "$ns" link del eth0 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  # Deepest first, lazily: a mount still busy for a moment goes when it is free.
  for mnt in $(awk -v d="$(node_dir "$k")/" -v r="$(real_node_run "$k")/" 'index($2, d) == 1 || index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount -l "$mnt" 2>/dev/null || true
  done
  rm -rf "$(real_node_run "$k")"
}
