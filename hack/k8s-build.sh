#!/usr/bin/env bash
# Build (once, cached) the upstream components the local cluster runs, from their published
# Go modules. No upstream source is copied into this repository: tests/k8s/*/go.mod + go.sum
# pin the versions, like a lockfile, and `go build` compiles from the module cache.
#
#   hack/k8s-build.sh [VERSION]         build Kubernetes VERSION (1.37, 1.34.4, ...; default
#                                       $DEFAULT_K8S_VERSION) + etcd + containerd (+ helm)
#   hack/k8s-build.sh --lock VERSION    (re)write tests/k8s/v<minor>/go.mod for the newest
#                                       patch of that minor the Go proxy serves
#   hack/k8s-build.sh --tools           build only etcd, containerd, helm
#   hack/k8s-build.sh --print-bindir V  print the bin dir of Kubernetes V (no build)
#
# Output: $FGPU_CACHE/k8s/<version>/bin/{kube-apiserver,kube-controller-manager,
# kube-scheduler,kubelet,kubectl} and $FGPU_CACHE/k8s/tools/<tool>-<version>/bin/.
# A bin dir with a .complete stamp is reused as is. Build logs: $FGPU_CACHE/k8s/*.build.log.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
NICE="nice -n ${FGPU_BUILD_NICE:-10}"
WITH_HELM="${FGPU_WITH_HELM:-1}"

ensure_go() {
  command -v go >/dev/null || die "Go is not installed (need >= the version each go.mod names; /usr/local/go/bin/go)"
}

# Newest patch of a minor on the Go proxy: newest_patch k8s.io/kubernetes 1.37 v1
newest_patch() {
  local mod="$1" minor="$2" tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && go mod init tmp >/dev/null 2>&1 && go list -m -versions "$mod") | tr ' ' '\n' \
    | grep -E "^v${minor//./\\.}\.[0-9]+$" | sort -V | tail -1
  rm -rf "$tmp"
}

# Write tests/k8s/v<minor>/go.mod: require k8s.io/kubernetes, replace every staging module
# (which the release's own go.mod points at ./staging/src/...) by its published v0.N.x.
lock_k8s() {
  local want="${1#v}" minor full dir kmod gover staging
  minor="$(k8s_minor "$want")"
  case "$want" in *.*.*) full="$want" ;; *) full="$(newest_patch k8s.io/kubernetes "$minor")"; full="${full#v}" ;; esac
  [ -n "$full" ] || die "the Go proxy serves no k8s.io/kubernetes v$minor.x"
  dir="$(k8s_lockdir "$full")"
  log "locking Kubernetes v$full in ${dir#"$FGPU_ROOT"/}"
  kmod="$(cd "$(mktemp -d)" && go mod init tmp >/dev/null 2>&1 && go mod download -json "k8s.io/kubernetes@v$full" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [ -f "$kmod" ] || die "could not download k8s.io/kubernetes@v$full"
  gover="$(awk '$1=="go"{print $2; exit}' "$kmod")"
  staging="$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$kmod" | sort -u)"
  [ -n "$staging" ] || die "no staging replaces found in $kmod"
  local stagever="v0.${full#1.}"
  rm -rf "$dir"; mkdir -p "$dir"
  (
    cd "$dir"
    go mod init "fgpu.dev/tests/k8s/kubernetes-${minor/./-}" >/dev/null 2>&1
    local args=(-go="$gover" -require="k8s.io/kubernetes@v$full")
    local m v fallback=""
    # The proxy does not serve every patch of every staging module: where v0.N.x is missing,
    # take the newest v0.N.y <= x it serves (adjacent patches of a staging module are
    # compatible; recorded in the lockfile header).
    for m in $staging; do
      local vers
      if ! vers="$(go list -m -versions "$m" 2>/dev/null)"; then
        # e.g. k8s.io/sample-controller: not served at all, and not needed by the commands
        log "NOTE: the Go proxy serves no $m; left without a replace (the commands do not import it)"
        continue
      fi
      if grep -qw -- "$stagever" <<<"$vers"; then v="$stagever"
      else
        v="$(tr ' ' '\n' <<<"$vers" | grep -E "^v0\.${minor#1.}\.[0-9]+$" | sort -V \
          | awk -v max="$stagever" '{ split($0,a,"."); split(max,b,"."); if (a[3]+0 <= b[3]+0) last=$0 } END { print last }')"
        if [ -z "$v" ]; then
          # none of this minor at all (k8s.io/metrics v0.31.x): the newest of the previous minor
          v="$(tr ' ' '\n' <<<"$vers" | grep -E "^v0\.$(( ${minor#1.} - 1 ))\.[0-9]+$" | sort -V | tail -1)"
        fi
        [ -n "$v" ] || die "the Go proxy serves no $m v0.${minor#1.}.x <= $stagever, nor a v0.$(( ${minor#1.} - 1 )).x"
        log "WARNING: $m $stagever is not on the Go proxy; using $v"
        fallback="$fallback $m@$v"
      fi
      args+=(-replace="$m=$m@$v")
    done
    for m in "${K8S_CMDS[@]}"; do args+=(-tool="k8s.io/kubernetes/cmd/$m"); done
    go mod edit "${args[@]}"
    go mod tidy
    echo "$fallback" >.fallback
  ) || die "go mod tidy failed for Kubernetes v$full"
  local fb; fb="$(cat "$dir/.fallback")"; rm -f "$dir/.fallback"
  sed -i "1i // Lockfile for the local cluster (hack/k8s-build.sh --lock $minor): pins Kubernetes v$full.\n// Staging modules replaced by their published $stagever${fb:+ (not on the proxy, nearest older patch used:$fb)}. No source of ours here." "$dir/go.mod"
}

# Lock a tool module: lock_tool <dir> <module> <version> <pkg...>
lock_tool() {
  local d="$FGPU_ROOT/tests/k8s/$1" mod="$2" ver="$3"; shift 3
  [ -f "$d/go.mod" ] && return 0
  log "locking $mod $ver in ${d#"$FGPU_ROOT"/}"
  mkdir -p "$d"
  (
    cd "$d"
    go mod init "fgpu.dev/tests/k8s/$(basename "$d")" >/dev/null 2>&1
    local args=(-require="$mod@$ver") p gover
    for p in "$@"; do args+=(-tool="$p"); done
    go mod edit "${args[@]}"
    # shellcheck disable=SC2016 # $1 and $2 are awk's fields
    gover="$(go mod download -json "$mod@$ver" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' | xargs awk '$1=="go"{print $2; exit}')"
    [ -n "$gover" ] && go mod edit -go="$gover"
    go mod tidy
    sed -i "1i // Lockfile for the local cluster (hack/k8s-build.sh): pins the $(basename "$d") the harness builds. No source of ours here." go.mod
  ) || die "locking $mod failed"
}

# go_build <lockdir> <outdir> <name> <tags> <pkg...>: one `go build` for all packages.
go_build() {
  local lockdir="$1" out="$2" name="$3" tags="$4"; shift 4
  if [ -f "$out/.complete" ]; then log "$name: cached in $out"; return 0; fi
  mkdir -p "$out"
  local blog; blog="$(dirname "$(dirname "$out")")/$name.build.log"
  log "building $name -> $out (log: $blog)"
  local t0=$SECONDS
  (
    cd "$lockdir"
    # -mod=readonly: the lockfile must be complete; -trimpath: reproducible paths.
    CGO_ENABLED="${CGO_ENABLED:-0}" GOFLAGS="-mod=readonly -buildvcs=false" \
      $NICE go build -trimpath -tags "$tags" -ldflags "-s -w ${EXTRA_LDFLAGS:-}" -o "$out/" "$@"
  ) >"$blog" 2>&1 || { tail -30 "$blog" >&2; die "building $name failed (full log: $blog)"; }
  local dt=$((SECONDS - t0))
  echo "$name built in ${dt}s on $(nproc) cores, $(du -sh "$out" | cut -f1) of binaries, $(date -u +%FT%TZ)" | tee "$out/.complete" >&2
}

build_k8s() {
  local v; v="$(resolve_k8s_version "$1")"
  local lockdir out pkgs=() c
  lockdir="$(k8s_lockdir "$v")"; out="$(k8s_bindir "$v")"
  for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  # Old releases' dependencies (modern-go/reflect2 < 1.0.2 etc.) use go:linkname that new Go refuses.
  # Version stamps as Kubernetes' own hack/lib/version.sh sets them (else "v0.0.0-master").
  local minor pkgv ld="-checklinkname=0"
  minor="${v#1.}"; minor="${minor%%.*}"
  for pkgv in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkgv.gitVersion=v$v -X $pkgv.gitMajor=1 -X $pkgv.gitMinor=$minor -X $pkgv.gitTreeState=clean"
    ld="$ld -X $pkgv.buildDate=1970-01-01T00:00:00Z"
  done
  EXTRA_LDFLAGS="$ld" go_build "$lockdir" "$out" "kubernetes-$v" "" "${pkgs[@]}"
}

build_tools() {
  # etcd: the server module's main package is the etcd binary.
  lock_tool etcd go.etcd.io/etcd/server/v3 "${ETCD_VERSION:-v3.7.3}" go.etcd.io/etcd/server/v3
  lock_tool containerd github.com/containerd/containerd/v2 "${CONTAINERD_VERSION:-v2.4.2}" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
  go_build "$FGPU_ROOT/tests/k8s/etcd" "$(dirname "$(etcd_bin)")" "etcd-$(tool_version etcd go.etcd.io/etcd/server/v3)" "" \
    go.etcd.io/etcd/server/v3
  # The etcd server package builds as "server" (module path .../server/v3): name it etcd.
  local eb; eb="$(dirname "$(etcd_bin)")"
  if [ -f "$eb/server" ]; then mv -f "$eb/server" "$eb/etcd"; fi
  go_build "$FGPU_ROOT/tests/k8s/containerd" "$(containerd_bindir)" "containerd-$(tool_version containerd github.com/containerd/containerd/v2)" \
    "no_btrfs no_devmapper no_zfs no_aufs" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
  if [ "$WITH_HELM" = 1 ]; then
    lock_tool helm helm.sh/helm/v3 "${HELM_VERSION:-v3.22.0}" helm.sh/helm/v3/cmd/helm
    go_build "$FGPU_ROOT/tests/k8s/helm" "$(dirname "$(helm_bin)")" "helm-$(tool_version helm helm.sh/helm/v3)" "" helm.sh/helm/v3/cmd/helm
  fi
}

main() {
  ensure_go
  mkdir -p "$FGPU_CACHE/k8s" "$GOMODCACHE" "$GOCACHE"
  case "${1:-}" in
    --lock) [ -n "${2:-}" ] || die "usage: $0 --lock VERSION"; lock_k8s "$2" ;;
    --tools) build_tools ;;
    --print-bindir) k8s_bindir "$(resolve_k8s_version "${2:-}")" ;;
    -h|--help) sed -n '2,17p' "$0" ;;
    *)
      local want="${1:-$DEFAULT_K8S_VERSION}"
      [ -n "$(k8s_pinned "$want")" ] || lock_k8s "$want"
      build_tools
      build_k8s "$want"
      ;;
  esac
}
main "$@"
