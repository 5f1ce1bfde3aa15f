#!/bin/sh
# The node image's install step (the DaemonSets' init container): puts the in-container shim
# (and, in the fake image, the fake CUDA driver) into the host directory the plugin's CDI
# specs name, links the host driver's NVML where the plugin's LD_LIBRARY_PATH looks, and in
# fake-GPU mode makes stand-in device nodes. Copy + rename, never overwrite in place: running
# containers keep the old file's inode.
#   FGPU_LIB_DIR            host directory for libfgpu.so (default /var/lib/fgpu/lib)
#   FGPU_FAKE_DEVICE_ROOT   fake mode: make /dev/nvidia* stand-ins (char 1:3) there
set -eu
lib="${FGPU_LIB_DIR:-/var/lib/fgpu/lib}"
mkdir -p "$lib"
put() {
  cp "$1" "$lib/.$2.new"
  mv -f "$lib/.$2.new" "$lib/$2"
  echo "installed $lib/$2"
}
put /usr/lib/fgpu/libfgpu.so libfgpu.so
if [ -e /usr/lib/fgpu/fake/libfgpu_fake_cuda.so ]; then
  put /usr/lib/fgpu/fake/libfgpu_fake_cuda.so libfgpu_fake_cuda.so
fi
if [ -n "${FGPU_FAKE_DEVICE_ROOT:-}" ]; then
  mkdir -p "$FGPU_FAKE_DEVICE_ROOT"
  for n in nvidiactl nvidia-uvm nvidia-uvm-tools nvidia0 nvidia1 nvidia2 nvidia3 nvidia4 nvidia5 nvidia6 nvidia7; do
    [ -c "$FGPU_FAKE_DEVICE_ROOT/$n" ] || mknod -m 0666 "$FGPU_FAKE_DEVICE_ROOT/$n" c 1 3
  done
  echo "fake device nodes in $FGPU_FAKE_DEVICE_ROOT"
fi
if [ -d /run/fgpu-nvml ]; then
  for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /lib/x86_64-linux-gnu /lib64; do
    if [ -e "/driver-root$d/libnvidia-ml.so.1" ]; then
      ln -sf "/driver-root$d/libnvidia-ml.so.1" /run/fgpu-nvml/libnvidia-ml.so.1
      echo "NVML: /driver-root$d/libnvidia-ml.so.1"
      exit 0
    fi
  done
  echo "NOTE: no libnvidia-ml.so.1 below /driver-root (fine with --backend fake)"
fi
