#!/usr/bin/env bash
# Run the pinned cargo-deny on the workspace, building it first when this machine has none.
# Built from crates.io (cargo install --locked) into $FGPU_CACHE/tools/cargo-deny-<version>,
# so a machine builds it once (a few minutes on 2 cores) and every later run reuses it
# (cached_cargo_tool in lib.sh; its build directory is not the workspace's).
# cargo deny reads the graph with `cargo metadata`, which needs the sources of every crate in
# Cargo.lock, those of other platforms too (a build fetches only this one's): when the local
# registry lacks some, `cargo fetch` brings them first, so the check itself runs --offline.
#   hack/cargo-deny.sh --offline check licenses bans sources      (make deny)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CARGO_DENY_VERSION="${CARGO_DENY_VERSION:-0.20.2}"
bin="$(cached_cargo_tool cargo-deny "$CARGO_DENY_VERSION")"

cd "$FGPU_ROOT"
if ! cargo metadata --offline --all-features --format-version 1 >/dev/null 2>&1; then
  log "fetching the crate sources cargo metadata needs (every platform's)"
  cargo fetch --quiet
fi
exec "$bin" "$@"
