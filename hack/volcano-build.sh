#!/usr/bin/env bash
# Build (once, cached) Volcano's scheduler and controller manager from the published Go
# module, for hack/volcano-install.sh. tests/k8s/volcano/go.mod + go.sum pin the version
# (`tool` lines and a replace block, see the comment there), like kwok's lockfile.
#
#   hack/volcano-build.sh          build if missing; prints the bin/ directory
#
# Output: $FGPU_CACHE/k8s/tools/volcano-<version>/bin/{vc-scheduler,vc-controller-manager}
# (a .complete stamp marks it done) and next to bin/ crds/: the module's
# CustomResourceDefinitions as published (config/crd/volcano/bases). The webhook manager is
# not built: the harness registers no admission webhook (docs/platforms.md says what that
# asks of a vcjob).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
lock="$FGPU_ROOT/tests/k8s/volcano"
ver="$(tool_version volcano volcano.sh/volcano)"
[ -n "$ver" ] || die "no volcano.sh/volcano version in $lock/go.mod"
out="$(tools_bindir "volcano-$ver")"
if [ ! -f "$out/.complete" ] || [ ! -x "$out/vc-scheduler" ] || [ ! -x "$out/vc-controller-manager" ]; then
  command -v go >/dev/null || die "Go is not installed (/usr/local/go/bin/go)"
  mkdir -p "$out" "$GOMODCACHE" "$GOCACHE"
  blog="$FGPU_CACHE/k8s/volcano-$ver.build.log"
  log "building volcano $ver (log: $blog)"
  start=$SECONDS
  : >"$blog"
  for cmd in scheduler controller-manager; do
    (cd "$lock" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
      nice -n "${FGPU_BUILD_NICE:-10}" go build -trimpath -ldflags "-s -w" \
      -o "$out/vc-$cmd" "volcano.sh/volcano/cmd/$cmd") \
      >>"$blog" 2>&1 || die "volcano $cmd build failed: $blog"
  done
  mod="$(cd "$lock" && go list -m -f '{{.Dir}}' volcano.sh/volcano)"
  rm -rf "$out/../crds"
  mkdir -p "$out/../crds"
  cp "$mod"/config/crd/volcano/bases/*.yaml "$out/../crds/"
  chmod -R u+w "$out/../crds"
  touch "$out/.complete"
  log "volcano $ver built in $((SECONDS - start))s"
fi
echo "$out"
