#!/usr/bin/env bash
# Run the pinned cargo-deny on the workspace, building it first when this machine has none.
# Built from crates.io (cargo install --locked) into $FGPU_CACHE/tools/cargo-deny-<version>,
# so a machine builds it once (a few minutes on 2 cores) and every later run reuses it; its
# build directory ($FGPU_CACHE/target-deny) is not the workspace's and is removed afterwards.
# cargo deny reads the graph with `cargo metadata`, which needs the sources of every crate in
# Cargo.lock, those of other platforms too (a build fetches only this one's): when the local
# registry lacks some, `cargo fetch` brings them first, so the check itself runs --offline.
#   hack/cargo-deny.sh --offline check licenses bans sources      (make deny)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CARGO_DENY_VERSION="${CARGO_DENY_VERSION:-0.20.2}"
root="$FGPU_CACHE/tools/cargo-deny-$CARGO_DENY_VERSION"
bin="$root/bin/cargo-deny"

if [ ! -x "$bin" ]; then
  mkdir -p "$FGPU_CACHE/tools"
  # One build at a time on a machine; a second caller waits and then finds the binary.
  exec 9>"$FGPU_CACHE/tools/.cargo-deny.lock"
  flock 9
  if [ ! -x "$bin" ]; then
    build_dir="$FGPU_CACHE/target-deny"
    partial="$root.partial"
    rm -rf "$partial" "$build_dir"
    log "building cargo-deny $CARGO_DENY_VERSION into $root (once per machine)"
    start=$SECONDS
    CARGO_TARGET_DIR="$build_dir" cargo install --quiet --locked cargo-deny \
      --version "=$CARGO_DENY_VERSION" --root "$partial"
    mv "$partial" "$root"
    rm -rf "$build_dir"
    log "cargo-deny $CARGO_DENY_VERSION built in $((SECONDS - start))s"
  fi
  exec 9>&-
fi

cd "$FGPU_ROOT"
if ! cargo metadata --offline --all-features --format-version 1 >/dev/null 2>&1; then
  log "fetching the crate sources cargo metadata needs (every platform's)"
  cargo fetch --quiet
fi
exec "$bin" "$@"
