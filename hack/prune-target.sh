#!/usr/bin/env bash
# Keep the cached cargo target dir ($CARGO_TARGET_DIR, by default $FGPU_CACHE/target, shared
# by every checkout on the machine) under FGPU_TARGET_MAX_GB GiB (default 30); it otherwise
# grows with every toolchain, profile and dependency version a long-lived machine has seen.
# Below the limit it does nothing. Over it, first the incremental/ dirs go (rebuilt as
# needed, the largest stale part), then, if still over, everything in the target dir.
# It touches nothing outside the target dir, only a dir cargo made (CACHEDIR.TAG at its
# top), and only while no cargo build holds it: it takes the build locks (.cargo-lock) that
# cargo takes, and leaves everything as is if one is held (a later run prunes).
#   hack/prune-target.sh                 (first step of make test)
#   FGPU_TARGET_MAX_GB=10 hack/prune-target.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

max_gb="${FGPU_TARGET_MAX_GB:-30}"
[[ "$max_gb" =~ ^[0-9]+$ ]] || die "FGPU_TARGET_MAX_GB must be a whole number of GiB, not '$max_gb'"
max_mib=$((max_gb * 1024))
dir="$CARGO_TARGET_DIR"
[ -d "$dir" ] || exit 0
dir="$(cd "$dir" && pwd -P)"
if [ "$dir" = / ] || [ ! -f "$dir/CACHEDIR.TAG" ]; then
  log "prune-target: $dir has no CACHEDIR.TAG (not a cargo target dir): left alone"
  exit 0
fi

# MiB used by the paths given (files vanishing under a concurrent reader are no error)
size_mib() { { du -smc "$@" 2>/dev/null || true; } | tail -1 | cut -f1; }
gib() { awk -v m="$1" 'BEGIN { printf "%.1f GiB", m / 1024 }'; }

size="$(size_mib "$dir")"
[ "${size:-0}" -gt "$max_mib" ] || exit 0
log "prune-target: $dir holds $(gib "$size"), over FGPU_TARGET_MAX_GB=$max_gb"

# cargo's own build locks, held until this script exits: a build that starts meanwhile waits
while IFS= read -r -d '' lock; do
  exec {fd}>>"$lock"
  if ! flock -n "$fd"; then
    log "prune-target: a cargo build holds $lock; nothing pruned this time"
    exit 0
  fi
done < <(find "$dir" -maxdepth 3 -type f -name .cargo-lock -print0)

mapfile -d '' incremental < <(find "$dir" -mindepth 2 -maxdepth 3 -type d -name incremental -prune -print0)
if [ ${#incremental[@]} -gt 0 ]; then
  log "prune-target: removing ${#incremental[@]} incremental dirs ($(gib "$(size_mib "${incremental[@]}")"))"
  rm -rf -- "${incremental[@]}"
  size="$(size_mib "$dir")"
  log "prune-target: $dir now holds $(gib "$size")"
fi
if [ "${size:-0}" -gt "$max_mib" ]; then
  log "prune-target: still over the limit: emptying $dir (the next build starts from scratch)"
  find "$dir" -mindepth 1 -maxdepth 1 ! -name CACHEDIR.TAG -exec rm -rf -- {} +
  log "prune-target: $dir now holds $(gib "$(size_mib "$dir")")"
fi
