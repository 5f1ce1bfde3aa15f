#!/usr/bin/env bash
# Build the images the local cluster needs, as OCI archives, and import them into containerd.
# Nothing can be pulled on these machines, so:
#   fgpu.local/pause:3.10     a static pause binary (tests/images/pause.c)
#   fgpu.local/workload:dev   busybox (Debian busybox-static), glibc, fgpu-probe
#                             (tests/images/fgpu-probe.c), and when built: the fake CUDA driver
#                             + NVML (libfgpu_fake_cuda.so as libcuda.so.1 / libnvidia-ml.so.1),
#                             /usr/local/bin/fgpu-bypass (allocates through the fake driver
#                             without the shim, tests/fake-cuda) and the shim
#                             /usr/lib/fgpu/libfgpu.so, from $CARGO_TARGET_DIR.
#   fgpu.local/kubelet-plugin:dev and fgpu.local/kubelet-plugin-fake:dev
#                             only when fgpu-kubelet-plugin, libfgpu.so and the fake CUDA
#                             driver are built: deploy/images/kubelet-plugin/Dockerfile's
#                             content (/usr/bin/fgpu-kubelet-plugin stripped + its shared-library
#                             closure, /usr/lib/fgpu/libfgpu.so, /usr/lib/fgpu/install.sh,
#                             busybox, the licence), and -fake: that plus the fake CUDA driver
#                             /usr/lib/fgpu/fake/libfgpu_fake_cuda.so and the fake profile
#                             /etc/fgpu/fake/e2e-node.yaml (deploy/images/kubelet-plugin-fake).
#                             Rebuilt only when an input is newer.
#   fgpu.local/controller:dev only when fgpu-controller is built: /usr/local/bin/fgpu-controller
#                             (stripped) + its shared-library closure (libc, libm, libgcc_s,
#                             the loader; TLS is rustls, so no OpenSSL), /etc/passwd with
#                             nonroot; nothing else (no shell). User 65532:65532 (so
#                             runAsNonRoot can check it), entrypoint the binary. The image
#                             deploy/controller/controller.yaml's __IMAGE__ stands for in the
#                             e2e harness (tests/e2e/45-controller-deployment). Rebuilt only
#                             when an input is newer. FGPU_CONTROLLER_BIN=<file> packs that
#                             binary instead of the newest of debug/release (which, with a
#                             target dir shared by several checkouts, may be another's).
#
#   hack/images.sh build            write _out/images/{pause,workload}.tar (+ kubelet-plugin.tar,
#                                   controller.tar)
#   hack/images.sh import           import them into the running cluster's containerd
#   hack/images.sh plugin           (re)build kubelet-plugin.tar if stale and import it
#   hack/images.sh controller       (re)build controller.tar if stale and import it
#   FGPU_IMAGES_FORCE=1             repack the plugin and controller images even when up to date
#   hack/images.sh buildah-probe    install Debian's buildah and see whether it runs here
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMAGES_DIR="$FGPU_ROOT/_out/images"
PAUSE_IMAGE="fgpu.local/pause:3.10"
WORKLOAD_IMAGE="fgpu.local/workload:dev"
PLUGIN_IMAGE="fgpu.local/kubelet-plugin:dev"
PLUGIN_FAKE_IMAGE="fgpu.local/kubelet-plugin-fake:dev"
CONTROLLER_IMAGE="fgpu.local/controller:dev"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FGPU_CACHE/target}"

# Newest of debug/release for an artifact name; empty if neither exists.
cargo_artifact() {
  local f best=""
  for f in "$CARGO_TARGET_DIR/debug/$1" "$CARGO_TARGET_DIR/release/$1"; do
    [ -f "$f" ] || continue
    if [ -z "$best" ] || [ "$f" -nt "$best" ]; then best="$f"; fi
  done
  echo "$best"
}

# Copy a dynamic ELF's shared-library closure (as the host resolves it) into a rootfs.
copy_libs() {
  local root="$1"; shift
  local lib
  # "name => /path (addr)" lines, and the loader's own "/lib64/ld-linux-x86-64.so.2 (addr)"
  for lib in $(ldd "$@" 2>/dev/null | awk '$2=="=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' | sort -u); do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

build() {
  ensure_pkgs busybox-static gcc libc6-dev python3
  mkdir -p "$IMAGES_DIR"
  local work; work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN

  # pause
  mkdir -p "$work/pause"
  gcc -static -Os -s -o "$work/pause/pause" "$FGPU_ROOT/tests/images/pause.c"
  python3 "$FGPU_ROOT/tests/images/mkoci.py" "$work/pause" "$PAUSE_IMAGE" "$IMAGES_DIR/pause.tar" --entrypoint /pause

  # workload
  local r="$work/workload" a
  mkdir -p "$r"/{bin,etc,tmp,proc,sys,dev,root,usr/local/bin,usr/lib/fgpu,lib64,lib/x86_64-linux-gnu,usr/lib/x86_64-linux-gnu}
  chmod 1777 "$r/tmp"
  cp /bin/busybox "$r/bin/busybox"
  for a in $("$r/bin/busybox" --list); do [ -e "$r/bin/$a" ] || ln -s busybox "$r/bin/$a"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
  gcc -O2 -Wall -o "$r/usr/local/bin/fgpu-probe" "$FGPU_ROOT/tests/images/fgpu-probe.c" -ldl
  local fake shim bypass have=()
  # The shim and the fake CUDA driver are cdylibs, which `cargo test` does not leave in the
  # target dir: build them (a no-op when up to date), so that a fresh machine's first image
  # has them whoever starts the cluster (make test, make demo, a bench).
  (cd "$FGPU_ROOT" && cargo build -q -p fgpu-hook -p fgpu-fake-cuda) \
    || log "NOTE: cargo build -p fgpu-hook -p fgpu-fake-cuda failed: using what the target dir holds"
  fake="$(cargo_artifact libfgpu_fake_cuda.so)"
  shim="$(cargo_artifact libfgpu.so)"
  bypass="$(cargo_artifact fgpu-bypass)"
  if [ -n "$fake" ]; then
    cp "$fake" "$r/usr/lib/x86_64-linux-gnu/libfgpu_fake_cuda.so"
    ln -s libfgpu_fake_cuda.so "$r/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    ln -s libcuda.so.1 "$r/usr/lib/x86_64-linux-gnu/libcuda.so"
    ln -s libfgpu_fake_cuda.so "$r/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    have+=("fake CUDA from $fake")
  else
    log "NOTE: no libfgpu_fake_cuda.so in $CARGO_TARGET_DIR/{debug,release} (tests/fake-cuda not built): the workload image has no fake CUDA driver"
  fi
  if [ -n "$bypass" ]; then
    cp "$bypass" "$r/usr/local/bin/fgpu-bypass"
    have+=("fgpu-bypass from $bypass")
  else
    log "NOTE: no fgpu-bypass in $CARGO_TARGET_DIR/{debug,release} (tests/fake-cuda not built): the workload image has no shim-free test program"
  fi
  if [ -n "$shim" ]; then
    cp "$shim" "$r/usr/lib/fgpu/libfgpu.so"
    have+=("shim from $shim")
  else
    log "NOTE: no libfgpu.so in $CARGO_TARGET_DIR/{debug,release} (hook-lib not built): the workload image has no shim"
  fi
  copy_libs "$r" "$r/usr/local/bin/fgpu-probe" ${fake:+"$fake"} ${shim:+"$shim"} ${bypass:+"$bypass"}
  ldconfig -r "$r" 2>/dev/null || true
  printf '%s\n' "fgpu workload image, built $(date -u +%FT%TZ)" "${have[@]}" >"$r/etc/fgpu-image"
  python3 "$FGPU_ROOT/tests/images/mkoci.py" "$r" "$WORKLOAD_IMAGE" "$IMAGES_DIR/workload.tar" --cmd /bin/sh
  [ ${#have[@]} -gt 0 ] && log "workload image holds: ${have[*]}"
  build_plugin
  build_controller
}

# The node images, with the content deploy/images/kubelet-plugin/Dockerfile and
# deploy/images/kubelet-plugin-fake/Dockerfile declare (tests/images/check-dockerfiles.py
# checks it): fgpu.local/kubelet-plugin:dev, the production one (plugin, shim, install step,
# licence; no fake CUDA), and fgpu.local/kubelet-plugin-fake:dev, the same plus the fake CUDA
# driver and the harness's fake profile. The Dockerfiles' base image (distroless cc: glibc,
# libgcc) is stood in for by the binary's shared-library closure from this host. Returns 0
# and writes nothing when a binary is missing (a note says so) or the archives are up to date.
PLUGIN_APPLETS="sh cp mv mkdir ln mknod cat ls rm echo test"
build_plugin() {
  local out="$IMAGES_DIR/kubelet-plugin.tar" out_fake="$IMAGES_DIR/kubelet-plugin-fake.tar" bin shim fake
  local profile="$FGPU_ROOT/deploy/fake/e2e-node.yaml" install="$FGPU_ROOT/deploy/images/kubelet-plugin/install.sh"
  bin="$(cargo_artifact fgpu-kubelet-plugin)"
  shim="$(cargo_artifact libfgpu.so)"
  fake="$(cargo_artifact libfgpu_fake_cuda.so)"
  if [ -z "$bin" ] || [ -z "$shim" ] || [ -z "$fake" ]; then
    log "NOTE: fgpu-kubelet-plugin, libfgpu.so or libfgpu_fake_cuda.so not built in $CARGO_TARGET_DIR/{debug,release}: no $PLUGIN_IMAGE image"
    return 0
  fi
  local f stale=0
  [ -f "$out" ] && [ -f "$out_fake" ] || stale=1
  for f in "$bin" "$shim" "$fake" "$profile" "$install" "$FGPU_ROOT/LICENSE" "${BASH_SOURCE[0]}" "$FGPU_ROOT/tests/images/mkoci.py"; do
    if [ "$f" -nt "$out" ] || [ "$f" -nt "$out_fake" ]; then stale=1; fi
  done
  [ "${FGPU_IMAGES_FORCE:-0}" = 0 ] || stale=1
  if [ $stale = 0 ]; then log "$PLUGIN_IMAGE and $PLUGIN_FAKE_IMAGE are up to date ($out)"; return 0; fi
  ensure_pkgs busybox-static binutils python3
  mkdir -p "$IMAGES_DIR"
  # (no RETURN trap: build's own is global and would be replaced)
  local work; work="$(mktemp -d)"
  local r="$work/plugin" a
  mkdir -p "$r"/{bin,etc,tmp,proc,sys,dev,run,var/run,usr/bin,usr/lib/fgpu,usr/share/doc/fgpu}
  chmod 1777 "$r/tmp"
  # the base image's part: users, and the binary's shared libraries
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
  copy_libs "$r" "$bin"
  # the Dockerfile's COPY and RUN lines, one for one
  cp /bin/busybox "$r/bin/busybox"
  for a in $PLUGIN_APPLETS; do ln -s busybox "$r/bin/$a"; done
  # debug builds carry ~200 MiB of debug info: strip it (the image stays ~45 MiB)
  strip -o "$r/usr/bin/fgpu-kubelet-plugin" "$bin"
  cp "$shim" "$r/usr/lib/fgpu/libfgpu.so"
  install -m 0755 "$install" "$r/usr/lib/fgpu/install.sh"
  cp "$FGPU_ROOT/LICENSE" "$r/usr/share/doc/fgpu/LICENSE"
  printf '%s\n' "fgpu kubelet-plugin image, built $(date -u +%FT%TZ)" "plugin from $bin" "shim from $shim" >"$r/etc/fgpu-image"
  python3 "$FGPU_ROOT/tests/images/mkoci.py" "$r" "$PLUGIN_IMAGE" "$out" --entrypoint /usr/bin/fgpu-kubelet-plugin \
    --user 0:0 --label org.opencontainers.image.licenses=Apache-2.0 \
    || { rm -rf "$work"; die "packing $PLUGIN_IMAGE failed"; }
  # the fake image: FROM the production one, two more files
  mkdir -p "$r/usr/lib/fgpu/fake" "$r/etc/fgpu/fake"
  cp "$fake" "$r/usr/lib/fgpu/fake/libfgpu_fake_cuda.so"
  cp "$profile" "$r/etc/fgpu/fake/e2e-node.yaml"
  printf '%s\n' "fake CUDA from $fake (demo/test image)" >>"$r/etc/fgpu-image"
  python3 "$FGPU_ROOT/tests/images/mkoci.py" "$r" "$PLUGIN_FAKE_IMAGE" "$out_fake" --entrypoint /usr/bin/fgpu-kubelet-plugin \
    --user 0:0 --label org.opencontainers.image.licenses=Apache-2.0 \
    || { rm -rf "$work"; die "packing $PLUGIN_FAKE_IMAGE failed"; }
  rm -rf "$work"
  log "kubelet-plugin images hold: plugin from $bin, shim from $shim; the -fake one also fake CUDA from $fake"
}

# The controller's image (deploy/controller/controller.yaml). Like build_plugin: returns 0 and
# writes nothing when the binary is missing (a note says so) or the archive is up to date.
build_controller() {
  local out="$IMAGES_DIR/controller.tar" bin
  bin="${FGPU_CONTROLLER_BIN:-$(cargo_artifact fgpu-controller)}"
  if [ -z "$bin" ] || [ ! -f "$bin" ]; then
    log "NOTE: fgpu-controller not built in $CARGO_TARGET_DIR/{debug,release}: no $CONTROLLER_IMAGE image"
    return 0
  fi
  local f stale=0
  [ -f "$out" ] || stale=1
  for f in "$bin" "$FGPU_ROOT/LICENSE" "${BASH_SOURCE[0]}" "$FGPU_ROOT/tests/images/mkoci.py"; do
    if [ "$f" -nt "$out" ]; then stale=1; fi
  done
  [ "${FGPU_IMAGES_FORCE:-0}" = 0 ] || stale=1
  if [ $stale = 0 ]; then log "$CONTROLLER_IMAGE is up to date ($out)"; return 0; fi
  ensure_pkgs binutils python3
  mkdir -p "$IMAGES_DIR"
  local work; work="$(mktemp -d)"
  local r="$work/controller"
  mkdir -p "$r"/{etc,tmp,proc,sys,dev,usr/local/bin,usr/share/doc/fgpu}
  chmod 1777 "$r/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$r/etc/group"
  # a debug build is ~250 MiB, nearly all debug info: stripped ~33 MiB (a release one ~15 MiB)
  strip -o "$r/usr/local/bin/fgpu-controller" "$bin"
  cp "$FGPU_ROOT/LICENSE" "$r/usr/share/doc/fgpu/LICENSE"
  copy_libs "$r" "$bin"
  printf '%s\n' "fgpu controller image, built $(date -u +%FT%TZ)" "controller from $bin" >"$r/etc/fgpu-image"
  python3 "$FGPU_ROOT/tests/images/mkoci.py" "$r" "$CONTROLLER_IMAGE" "$out" \
    --entrypoint /usr/local/bin/fgpu-controller --user 65532:65532 --label org.opencontainers.image.licenses=Apache-2.0 \
    || { rm -rf "$work"; die "packing $CONTROLLER_IMAGE failed"; }
  rm -rf "$work"
  log "controller image holds: controller from $bin ($(du -k "$out" | cut -f1) KiB archive)"
}

# import_one <name>: _out/images/<name>.tar into the running cluster's containerd
import_one() {
  local sock="$CLUSTER_STATE/containerd/containerd.sock"
  [ -S "$sock" ] || die "containerd is not running ($sock missing): run hack/cluster-up.sh"
  # --no-unpack would leave the snapshotter to unpack on first use; unpack now so failures show here
  "$(containerd_bindir)/ctr" --address "$sock" -n k8s.io images import --snapshotter "${FGPU_SNAPSHOTTER:-overlayfs}" \
    "$IMAGES_DIR/$1.tar" >&2 || die "importing $1.tar into containerd failed"
}

import() {
  local ctr; ctr="$(containerd_bindir)/ctr"
  local sock="$CLUSTER_STATE/containerd/containerd.sock"
  [ -S "$sock" ] || die "containerd is not running ($sock missing): run hack/cluster-up.sh"
  local img
  for img in pause workload kubelet-plugin kubelet-plugin-fake controller; do
    case $img in kubelet-plugin|kubelet-plugin-fake|controller) [ -f "$IMAGES_DIR/$img.tar" ] || continue ;; esac # optional
    [ -f "$IMAGES_DIR/$img.tar" ] || die "$IMAGES_DIR/$img.tar missing: run hack/images.sh build"
    import_one "$img"
  done
  # kubelet's image GC must not remove the sandbox image
  "$ctr" --address "$sock" -n k8s.io images label "$PAUSE_IMAGE" io.cri-containerd.pinned=pinned >/dev/null
  "$ctr" --address "$sock" -n k8s.io images ls -q | sed 's/^/  image: /' >&2
}

case "${1:-build}" in
  build) build ;;
  import) import ;;
  all) build; import ;;
  plugin) # build (if stale) and import only the kubelet plugin's image
    build_plugin
    [ -f "$IMAGES_DIR/kubelet-plugin.tar" ] || die "no $PLUGIN_IMAGE image (binaries missing, see above)"
    import_one kubelet-plugin
    import_one kubelet-plugin-fake
    ;;
  controller) # build (if stale) and import only the controller's image
    build_controller
    [ -f "$IMAGES_DIR/controller.tar" ] || die "no $CONTROLLER_IMAGE image (fgpu-controller not built, see above)"
    import_one controller
    ;;
  buildah-probe) # whether Debian's buildah runs here (it could then build deploy/images/ itself)
    ensure_pkgs buildah
    buildah --version
    c="$(buildah --storage-driver vfs from scratch)" || die "buildah from scratch failed"
    buildah --storage-driver vfs rm "$c" >/dev/null
    log "buildah runs (vfs). The Dockerfiles' FROM images (rust, debian, distroless) cannot be pulled without a registry, so the harness keeps mkoci.py"
    ;;
  *) die "usage: $0 build|import|all|plugin|controller|buildah-probe" ;;
esac
