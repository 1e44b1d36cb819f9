#!/usr/bin/env bash
# Builds the container images of real nodes (NODE_KIND=kubelet) here, with no registry: OCI image
# layout tarballs under .noops/images, one per image, each laid out as its published image is
# (same paths, entrypoint, user), and .noops/images/built.txt naming them. hack/real-node.sh
# imports them into every node's containerd and the node agent serves them as every registry's
# mirror; a pull of any other image is refused.
# Idempotent: an image is written again only when what goes into it changed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cache=${NOOPS_CACHE:-$HOME/.cache/noops}
mkdir -p "$images_dir" "$cache/rootfs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
built=()

json_array() { local first=1 item; printf '['; for item in "$@"; do [ $first = 1 ] || printf ','; first=0; printf '"%s"' "$item"; done; printf ']'; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# oci_image <reference> <rootfs folder> <image config JSON (the "config" object)> [<tag>...]:
# writes $images_dir/<name>.tar unless the same inputs made it already; the extra tags name the
# same image (as `latest` does on a registry).
oci_image() {
  local ref=$1 rootfs=$2 config=$3 file key layout
  local also_tagged=("${@:4}")
  file="$images_dir/$(echo "$ref" | tr '/:' '__').tar"
  built+=("$ref")
  # The key: every file's path, mode, owner and content, and the config.
  key=$({ (cd "$rootfs" && find . -printf '%p %m %U %G %l\n' | sort && find . -type f -print0 | sort -z | xargs -0r sha256sum); echo "$config"; mirror_names "$ref"; echo "${also_tagged[*]}"; } | sha256sum | cut -c1-16)
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
  # containerd names the image by io.containerd.image.name: the full reference, as a pull would;
  # one entry per name (the image's own and its mirrors').
  local name entries=""
  local tag
  for name in "$ref" $(mirror_names "$ref") $(for tag in "${also_tagged[@]}"; do echo "${ref%:*}:$tag"; done); do
    entries+="${entries:+,}$(printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' \
      "$manifest_digest" "$manifest_size" "$(full_reference "$name")" "${name##*:}")"
  done
  printf '{"schemaVersion":2,"manifests":[%s]}' "$entries" > "$layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
  tar -C "$layout" --sort=name --mtime=@0 -cf "$file.tmp" oci-layout index.json blobs
  mv "$file.tmp" "$file"
  echo "$key" > "$file.key"
  rm -rf "$layout" "$work/layer.tar"
  log "image $ref built ($(du -h "$file" | cut -f1))"
}

# Registries that hold the same images under their own paths, as a user's mirror would: what
# the tests name through the operator's image settings (a registry for every project, one
# repository for one kind). A pull from anywhere else is refused.
declare -A mirrors=(
  [quay.io/coreos/etcd]="registry.example.com/mirror/coreos/etcd registry.example.com/etcd-team/etcd"
  [postgres]="registry.example.com/mirror/library/postgres registry.example.com/db-team/postgres registry.local/postgres"
)
# mirror_names <ref>: the same image's names in its mirrors.
mirror_names() {
  local repo=${1%:*} tag=${1##*:} mirror
  for mirror in ${mirrors[$repo]:-}; do echo "$mirror:$tag"; done
}

# full_reference <ref>: what a pull of <ref> resolves to (docker.io/library/ for short names).
full_reference() {
  local ref=$1 first=${1%%/*}
  if [[ $ref != */* ]]; then echo "docker.io/library/$ref"
  elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then echo "docker.io/$ref"
  else echo "$ref"; fi
}

# distroless_rootfs <folder> <binary>...: a rootfs laid out as distroless's cc-debian12:nonroot
# (the operator's Dockerfile base): the binaries under /usr/local/bin, stripped of debug info,
# the shared libraries they load (from this machine, Debian 12 as in distroless), users root and
# nonroot (65532), CA certificates, /tmp. No shell.
distroless_rootfs() {
  local rootfs=$1 binary lib; shift
  mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/home/nonroot" "$rootfs/lib64"
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$rootfs/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
  echo 'hosts: files dns' > "$rootfs/etc/nsswitch.conf"
  cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
  chown 65532:65532 "$rootfs/home/nonroot"
  for binary in "$@"; do
    objcopy --strip-debug "$binary" "$rootfs/usr/local/bin/$(basename "$binary")"
    for lib in $(ldd "$binary" | awk '$3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
  done
}

# Bump when a Debian rootfs below is made differently, to make them again.
rootfs_recipe=1
# debian_rootfs <name> <packages...>: Debian 12 (minbase, from Debian's mirror as `apt` here
# uses it) with those packages, cached outside the clone; prints its folder. A hook
# `prepare_<name>` (if defined) runs before the packages are installed, `finish_<name>` after;
# each gets the rootfs folder.
debian_rootfs() {
  local name=$1 out; shift
  out="$cache/rootfs/$name-$rootfs_recipe"
  if [ ! -f "$out.complete" ]; then
    local base="$cache/rootfs/debian-12-$rootfs_recipe" start=$SECONDS
    if [ ! -f "$base.complete" ]; then
      rm -rf "$base"
      debootstrap --variant=minbase bookworm "$base" "$(debian_mirror)" >/dev/null ||
        die "debootstrap of Debian 12 failed (is Debian's mirror reachable?)"
      printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
        "$(debian_mirror)" "$(debian_mirror)" "$(debian_mirror)" > "$base/etc/apt/sources.list"
      rm -rf "$base/var/cache/apt/archives"/*.deb
      touch "$base.complete"
    fi
    rm -rf "$out"; cp -a "$base" "$out"
    # No service starts while packages install.
    printf '#!/bin/sh\nexit 101\n' > "$out/usr/sbin/policy-rc.d"; chmod +x "$out/usr/sbin/policy-rc.d"
    if declare -F "prepare_$name" >/dev/null; then "prepare_$name" "$out"; fi
    if [ $# -gt 0 ]; then
      DEBIAN_FRONTEND=noninteractive chroot "$out" apt-get update -qq
      DEBIAN_FRONTEND=noninteractive chroot "$out" apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
        die "installing $* into the $name image failed"
    fi
    if declare -F "finish_$name" >/dev/null; then "finish_$name" "$out"; fi
    chroot "$out" apt-get clean
    rm -rf "$out"/var/lib/apt/lists/* "$out"/usr/share/doc/* "$out"/usr/share/man/* "$out"/var/log/*.log \
      "$out"/var/cache/ldconfig/aux-cache "$out/usr/sbin/policy-rc.d"
    touch "$out.complete"
    log "Debian rootfs $name made in $((SECONDS - start))s" >&2
  fi
  echo "$out"
}
# The mirror this machine's apt uses.
debian_mirror() {
  local uri
  uri=$(awk '$1 == "URIs:" { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
  echo "${uri:-http://deb.debian.org/debian}"
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

# --- postgres:15: laid out as the official image (docker-library/postgres, 15/bookworm) -------
# Debian 12 with Debian's PostgreSQL 15 (the official image takes it from apt.postgresql.org,
# which this machine does not reach), the postgres user and group 999, gosu, en_US.UTF-8,
# nss_wrapper, the same folders and modes, and an entrypoint of ours that behaves as theirs
# (cluster/images/postgres/docker-entrypoint.sh).
prepare_postgres-15() {
  chroot "$1" sh -c 'groupadd -r postgres --gid=999 && useradd -r -g postgres --uid=999 --home-dir=/var/lib/postgresql --shell=/bin/bash postgres && install -d -o postgres -g postgres -m 1777 /var/lib/postgresql'
  mkdir -p "$1/etc/postgresql-common/createcluster.d"
  echo "create_main_cluster = false" > "$1/etc/postgresql-common/createcluster.d/noops.conf"
}
finish_postgres-15() {
  chroot "$1" localedef -i en_US -c -f UTF-8 -A /usr/share/locale/locale.alias en_US.UTF-8
  sed -ri "s!^#?(listen_addresses)\s*=\s*\S+.*!\1 = '*'!" "$1/usr/share/postgresql/15/postgresql.conf.sample"
  mkdir -p "$1/docker-entrypoint-initdb.d"
  install -d -o 999 -g 999 -m 3777 "$1/var/run/postgresql"
  install -d -o 999 -g 999 -m 1777 "$1/var/lib/postgresql/data"
}
rootfs=$(debian_rootfs postgres-15 postgresql-15 gosu locales libnss-wrapper xz-utils zstd less)
install -m 755 "$root/cluster/images/postgres/docker-entrypoint.sh" "$rootfs/usr/local/bin/docker-entrypoint.sh"
pg_version=$(chroot "$rootfs" /usr/lib/postgresql/15/bin/postgres --version | awk '{ print $3 }')
oci_image postgres:15 "$rootfs" "{\"User\":\"\",\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/lib/postgresql/15/bin\",\"LANG=en_US.utf8\",\"PG_MAJOR=15\",\"PG_VERSION=$pg_version\",\"PGDATA=/var/lib/postgresql/data\"],\"Entrypoint\":$(json_array docker-entrypoint.sh),\"Cmd\":$(json_array postgres),\"StopSignal\":\"SIGINT\",\"ExposedPorts\":{\"5432/tcp\":{}},\"Volumes\":{\"/var/lib/postgresql/data\":{}}}"

# --- hashicorp/http-echo: the tests' echo server (ours, crates/testbins), where the official
# image keeps its own: /http-echo, the entrypoint. 1.0 and latest.
rootfs="$work/http-echo"
distroless_rootfs "$rootfs" "$target_dir/debug/http-echo"
mv "$rootfs/usr/local/bin/http-echo" "$rootfs/http-echo"
oci_image hashicorp/http-echo:1.0 "$rootfs" "{\"Entrypoint\":$(json_array /http-echo),\"ExposedPorts\":{\"5678/tcp\":{}}}" latest

# --- busybox: Debian's static busybox (the package, cached), laid out as the official image:
# /bin/busybox and a link per applet in /bin, root and nobody, CMD sh. 1.35 and latest.
busybox_deb=$(ls "$cache"/rootfs/busybox-static_*.deb 2>/dev/null | head -1 || true)
if [ -z "$busybox_deb" ]; then
  (cd "$cache/rootfs" && apt-get download busybox-static >/dev/null 2>&1) || die "downloading Debian's busybox-static failed"
  busybox_deb=$(ls "$cache"/rootfs/busybox-static_*.deb | head -1)
fi
rootfs="$work/busybox"
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp" "$rootfs/root" "$rootfs/var/spool/mail" "$rootfs/home"
chmod 1777 "$rootfs/tmp"
dpkg-deb --fsys-tarfile "$busybox_deb" | tar -xO ./bin/busybox > "$rootfs/bin/busybox"
chmod 755 "$rootfs/bin/busybox"
for applet in $("$rootfs/bin/busybox" --list); do [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"; done
printf 'root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/bin/false\nnobody:x:65534:65534:nobody:/home:/bin/false\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\ndaemon:x:1:\nnogroup:x:65534:\n' > "$rootfs/etc/group"
oci_image busybox:1.35 "$rootfs" "{\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"],\"Cmd\":$(json_array sh)}" latest

# --- versity/versitygw: the object store of examples/object-store, the build of tools/versitygw
# (static) as its entrypoint.
vgw_version=$(awk '$1 == "require" && $2 == "github.com/versity/versitygw" { print $3 }' "$root/tools/versitygw/go.mod")
rootfs="$work/versitygw"
mkdir -p "$rootfs/app" "$rootfs/tmp" "$rootfs/etc/ssl/certs"
chmod 1777 "$rootfs/tmp"
cp -L "$bin/versitygw" "$rootfs/app/versitygw"
cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
oci_image "versity/versitygw:$vgw_version" "$rootfs" "{\"Entrypoint\":$(json_array /app/versitygw),\"ExposedPorts\":{\"7070/tcp\":{}}}"

# --- ghcr.io/noops-dev/noops: the operator, as the Dockerfile makes it, from the cargo build ---
# (the debug build `make setup` made; the Dockerfile's is a release build). The tag is the
# chart's, so the chart installs it as it is.
noops_tag=$(sed -nE 's/^  tag: "([^"]+)"/\1/p' "$root/charts/noops/values.yaml")
rootfs="$work/noops"
distroless_rootfs "$rootfs" "$target_dir/debug/noops"
oci_image "ghcr.io/noops-dev/noops:$noops_tag" "$rootfs" \
  "{\"User\":\"65532:65532\",\"Entrypoint\":$(json_array /usr/local/bin/noops),\"Cmd\":$(json_array run --http-addr=0.0.0.0:8080 --log-format=json)}"

printf '%s\n' "${built[@]}" > "$images_dir/built.txt"
log "images: ${built[*]}"
