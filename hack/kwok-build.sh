#!/usr/bin/env bash
# Build (once, cached) kwok, the node simulator hack/bench-controller.sh uses, from its
# published Go module. tests/k8s/kwok/go.mod + go.sum pin the version (a `tool` line), like
# the other lockfiles under tests/k8s/; `go build` compiles from the module cache
# ($FGPU_CACHE/go, hack/lib.sh).
#
#   hack/kwok-build.sh          build if missing; prints the binary's path
#
# Output: $FGPU_CACHE/k8s/tools/kwok-<version>/bin/kwok (a .complete stamp marks it done) and
# next to bin/ stages.yaml: kwok's own "fast" node and pod stages plus the lease heartbeat
# (copied from the module: kwok runs nothing without stages; pass it with --config).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
lock="$FGPU_ROOT/tests/k8s/kwok"
ver="$(awk '$1 == "sigs.k8s.io/kwok" {print $2; exit}' "$lock/go.mod")"
[ -n "$ver" ] || die "no sigs.k8s.io/kwok version in $lock/go.mod"
out="$FGPU_CACHE/k8s/tools/kwok-$ver/bin"
if [ ! -f "$out/.complete" ] || [ ! -x "$out/kwok" ]; then
  command -v go >/dev/null || die "Go is not installed (/usr/local/go/bin/go)"
  mkdir -p "$out" "$GOMODCACHE" "$GOCACHE"
  log "building kwok $ver (log: $FGPU_CACHE/k8s/kwok-$ver.build.log)"
  (cd "$lock" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
    nice -n "${FGPU_BUILD_NICE:-10}" go build -trimpath -ldflags "-s -w" -o "$out/" sigs.k8s.io/kwok/cmd/kwok) \
    >"$FGPU_CACHE/k8s/kwok-$ver.build.log" 2>&1 || die "kwok build failed: $FGPU_CACHE/k8s/kwok-$ver.build.log"
  mod="$(cd "$lock" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  st="$mod/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"; cat "$st/$f"
  done >"$out/../stages.yaml"
  touch "$out/.complete"
fi
echo "$out/kwok"
