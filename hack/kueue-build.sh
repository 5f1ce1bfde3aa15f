#!/usr/bin/env bash
# Build (once, cached) Kueue's manager from its published Go module, for
# hack/kueue-install.sh. tests/k8s/kueue/go.mod + go.sum pin the version (a `tool` line),
# like kwok's lockfile; `go build` compiles from the module cache ($FGPU_CACHE/go, hack/lib.sh).
#
#   hack/kueue-build.sh          build if missing; prints the binary's path
#
# Output: $FGPU_CACHE/k8s/tools/kueue-<version>/bin/kueue (a .complete stamp marks it done)
# and next to bin/ crds/: the module's CustomResourceDefinitions as published
# (config/components/crd/bases), without the conversion webhooks that Kueue's kustomize
# patches add (the harness serves no webhook for them; see docs/platforms.md).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
lock="$FGPU_ROOT/tests/k8s/kueue"
ver="$(tool_version kueue sigs.k8s.io/kueue)"
[ -n "$ver" ] || die "no sigs.k8s.io/kueue version in $lock/go.mod"
out="$(tools_bindir "kueue-$ver")"
if [ ! -f "$out/.complete" ] || [ ! -x "$out/kueue" ]; then
  command -v go >/dev/null || die "Go is not installed (/usr/local/go/bin/go)"
  mkdir -p "$out" "$GOMODCACHE" "$GOCACHE"
  blog="$FGPU_CACHE/k8s/kueue-$ver.build.log"
  log "building kueue $ver (log: $blog)"
  start=$SECONDS
  (cd "$lock" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
    nice -n "${FGPU_BUILD_NICE:-10}" go build -trimpath -ldflags "-s -w" -o "$out/" sigs.k8s.io/kueue/cmd/kueue) \
    >"$blog" 2>&1 || die "kueue build failed: $blog"
  mod="$(cd "$lock" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  rm -rf "$out/../crds"
  mkdir -p "$out/../crds"
  cp "$mod"/config/components/crd/bases/*.yaml "$out/../crds/"
  chmod -R u+w "$out/../crds"
  touch "$out/.complete"
  log "kueue $ver built in $((SECONDS - start))s"
fi
echo "$out/kueue"
