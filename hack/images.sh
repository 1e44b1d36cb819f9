#!/usr/bin/env bash
# Builds the container images of real nodes (NODE_KIND=kubelet) here, with no registry: OCI image
# layout tarballs under .noops/images, one per image, each laid out as its published image is
# (same paths, entrypoint, user), and .noops/images/built.txt naming them. hack/real-node.sh
# imports them into every node's containerd; a pull of any other image is refused.
# Idempotent: an image is written again only when what goes into it changed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mkdir -p "$images_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
built=()

json_array() { local first=1 item; printf '['; for item in "$@"; do [ $first = 1 ] || printf ','; first=0; printf '"%s"' "$item"; done; printf ']'; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# oci_image <reference> <rootfs folder> <image config JSON (the "config" object)>: writes
# $images_dir/<name>.tar unless the same inputs made it already.
oci_image() {
  local ref=$1 rootfs=$2 config=$3 file key layout
  file="$images_dir/$(echo "$ref" | tr '/:' '__').tar"
  built+=("$ref")
  # The key: every file's path, mode, owner and content, and the config.
  key=$({ (cd "$rootfs" && find . -printf '%p %m %U %G %l\n' | sort && find . -type f -print0 | sort -z | xargs -0r sha256sum); echo "$config"; } | sha256sum | cut -c1-16)
  if [ -f "$file" ] && [ "$(cat "$file.key" 2>/dev/null)" = "$key" ]; then return; fi
  layout="$work/$(basename "$file" .tar)"
  mkdir -p "$layout/blobs/sha256"
  # One layer, reproducible: sorted, owned as the rootfs folder says, no timestamps.
  tar -C "$rootfs" --sort=name --numeric-owner --mtime=@0 --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -cf "$work/layer.tar" .
  local diff_id layer_digest layer_size config_digest config_size manifest_digest manifest_size
  diff_id=$(sha "$work/layer.tar")
  gzip -n -1 -c "$work/layer.tar" > "$work/layer.tar.gz"
  layer_digest=$(sha "$work/layer.tar.gz"); layer_size=$(stat -c %s "$work/layer.tar.gz")
  mv "$work/layer.tar.gz" "$layout/blobs/sha256/$layer_digest"
  printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"noops hack/images.sh"}]}' \
    "$config" "$diff_id" > "$work/config.json"
  config_digest=$(sha "$work/config.json"); config_size=$(stat -c %s "$work/config.json")
  mv "$work/config.json" "$layout/blobs/sha256/$config_digest"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config_digest" "$config_size" "$layer_digest" "$layer_size" > "$work/manifest.json"
  manifest_digest=$(sha "$work/manifest.json"); manifest_size=$(stat -c %s "$work/manifest.json")
  mv "$work/manifest.json" "$layout/blobs/sha256/$manifest_digest"
  # containerd names the image by io.containerd.image.name: the full reference, as a pull would.
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_digest" "$manifest_size" "$(full_reference "$ref")" "${ref##*:}" > "$layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
  tar -C "$layout" --sort=name --mtime=@0 -cf "$file.tmp" oci-layout index.json blobs
  mv "$file.tmp" "$file"
  echo "$key" > "$file.key"
  rm -rf "$layout" "$work/layer.tar"
  log "image $ref built ($(du -h "$file" | cut -f1))"
}

# full_reference <ref>: what a pull of <ref> resolves to (docker.io/library/ for short names).
full_reference() {
  local ref=$1 first=${1%%/*}
  if [[ $ref != */* ]]; then echo "docker.io/library/$ref"
  elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then echo "docker.io/$ref"
  else echo "$ref"; fi
}

# --- registry.k8s.io/pause: the sandbox of every pod, built from the kubelet's own source -------
pause_src=$(cd "$root/tools/kubelet" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
rootfs="$work/pause"
mkdir -p "$rootfs"
gcc -Os -Wall -static -DVERSION="v${pause_image##*:}-noops" -o "$rootfs/pause" "$pause_src"
chown -R 65535:65535 "$rootfs"
oci_image "$pause_image" "$rootfs" "{\"User\":\"65535:65535\",\"Entrypoint\":$(json_array /pause)}"

# --- quay.io/coreos/etcd: etcd's own image is distroless with its three binaries -------------
for minor in 3.5 3.6; do
  version=$(sed -nE 's|^// Wrapper module that builds etcd (v[0-9.]+) .*|\1|p' "$root/tools/etcd-$minor/go.mod")
  rootfs="$work/etcd-$minor"
  mkdir -p "$rootfs/usr/local/bin" "$rootfs/var/etcd" "$rootfs/var/lib/etcd" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp"
  for b in etcd etcdctl etcdutl; do cp -L "$bin/etcd-$minor/$b" "$rootfs/usr/local/bin/$b"; done
  oci_image "quay.io/coreos/etcd:$version" "$rootfs" \
    "{\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"],\"WorkingDir\":\"/var/lib/etcd\",\"Cmd\":$(json_array /usr/local/bin/etcd)}"
done

printf '%s\n' "${built[@]}" > "$images_dir/built.txt"
log "images: ${built[*]}"
