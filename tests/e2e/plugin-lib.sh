# shellcheck shell=bash
# Helpers for the scenarios that run fgpu's DRA kubelet plugin as a host process
# (tests/e2e/3*-dra-*/test.sh; sourced after lib.sh). The plugin itself is started by
# tests/e2e/30-dra-quota/plugin.sh (also used by make demo).
#
#   plugin_setup <tag>  build this checkout's plugin and dra_call (no-op when up to date; with
#                       FGPU_E2E_BIN_FROM=<dir>, take the binaries from that directory), copy
#                       them and the libraries into a fresh work dir ($work, bins in $work/bin,
#                       exported as FGPU_E2E_BIN_DIR, so a build elsewhere cannot swap them);
#                       FGPU_E2E_PROFILE=release takes the release build (the bench does);
#                       the plugin's run dir ($run_dir: checkpoint/<uid>.json, claims/<uid>/) on the
#                       cluster's tmpfs ($FGPU_CLUSTER_RUN, hack/cluster-up.sh), as /run/fgpu
#                       is on a real node, else $work/run; exported as FGPU_E2E_RUN_DIR
#   start_plugin        start it ($plugin_pid, log $work/plugin.log)
#   stop_plugin         SIGTERM, then SIGKILL after 10 s — only the pid this scenario started
#   wait_registered <n> until the log says "registered with the kubelet" n times
#   plugin_up           the DeviceClasses applied (lib.sh classes, at $api), the plugin started,
#                       registered once, its ResourceSlice published
#   plugin_cleanup      stop it, delete its ResourceSlice, print the log tail on failure
#                       (pass the exit status), remove $work
#   one_gpu_node <uuid> one fake GPU of exactly 80 GiB (an H100) with that UUID on this node,
#                       written to $work/gpus.yaml and exported as FGPU_E2E_FAKE_GPUS (before
#                       plugin_up; the queueing scenarios cut it into four 20 GiB shares)
#   fake_state_setup <dir>
#                       the node's shared fake GPU state (the fake driver's files,
#                       edits.rs FAKE_STATE_FILES), writable by every UID before the plugin
#                       (root) or a workload (uid 1000) opens it
#   alloc_patch <dev>   the status patch of a 512Mi share allocated on <dev> of this node's
#                       pool (GpuShareConfig from the claim), as if a scheduler had written it
#   shared_claim_pods <prefix> <n>
#                       apply template share-1gi (shared class, 1Gi) and n pods <prefix>-1..n
#                       (label app=<prefix>, uid 1000, sleeping) each with a claim from it
#   checkpoint_uids, cdi_spec_uids, claim_dir_uids
#                       the claim UIDs of the plugin's records, CDI specs and claim
#                       directories, sorted, one a line (what the node's books hold)
#   allocated_claim <name> <dev>
#                       create shared-class claim <name> in $E2E_NS, write that allocation on
#                       <dev>; prints its UID (the bench and the upgrade check prepare it
#                       themselves, no pod)
#   mig_node <profile> <uuid>
#                       $work/node.yaml: <profile> with GPU <uuid> migCapable in mode mig; the
#                       fake's instance state file beside it is $mig_state; stand-ins for the
#                       capability nodes of its instances (the fake's numbering, docs/mig.md:
#                       GPU instance gi on minor 0 is nvidia-cap<3+9·gi>, its compute instance
#                       the next) under /run/fgpu-e2e/dev, so runc can create them
#   mig_instances, mig_instance_uuids
#                       the instances in $mig_state, as "<profile>@<start>" or by UUID, sorted,
#                       on one line (none: empty)
#   mig_instances_are <list>
#                       mig_instances is <list> (a wait_until condition)
#   sampler_start <cmd...>
#                       run <cmd> back to back (then 0.2 s) in the background until
#                       sampler_stop; each output of a run that succeeded is a line
#                       "<epoch s> <output>" of $work/grants.log ($sampler: its pid)
#   sampler_stop        stop it (if it runs; the cleanup traps call it too)
#   assert_no_overgrant <shares> <bytes> <key> <what> <claims>
#                       stop the sampler; in $work/grants.log (books.py grants lines, at
#                       least 5): never more than <shares> claims, <bytes> granted or <shares>
#                       of <key> (<what>: its words in the messages), and at least once
#                       <claims> claims
#   obj_json <kind/name>
#                       the object of $E2E_NS as JSON in $work/obj.json; prints that path
#   claim_uids_of <kubectl get pods args...>
#                       the UIDs of the claims of the pods of $E2E_NS those args list, sorted,
#                       one a line
#   assert_share_claims <device> <memory> <kubectl get pods args...>
#                       each of those pods' claim is a <memory> share of <device> of this
#                       node's pool (books.py claim)
#   without <lines> <lines>
#                       the lines of the first not in the second (both sorted)
#   records_are <uids>  the checkpoint holds exactly <uids> (a wait_until condition)
#   none_recorded <uids>
#                       the checkpoint holds none of <uids> (a wait_until condition)
# shellcheck disable=SC2034 # used by the scripts that source this file
PLUGIN_DRIVER=gpu.fgpu.dev
PLUGIN_SLICE="$NODE_NAME-$PLUGIN_DRIVER"
PLUGIN_DRA_SOCK="$KUBELET_PLUGINS_DIR/$PLUGIN_DRIVER/dra.sock"
plugin_pid=""
work=""
run_dir=""
mig_state=""
sampler=""
# The books of the queueing scenarios (80, 81): grants on a GPU, claim shapes.
PLUGIN_BOOKS="$E2E_LIB_DIR/80-kueue-shares/books.py"

plugin_setup() {
  local target f profile="${FGPU_E2E_PROFILE:-debug}" flags=()
  target="${CARGO_TARGET_DIR:-${FGPU_CACHE:-/var/cache/fgpu}/target}/$profile"
  [ "$profile" = debug ] || flags=(--profile "$profile")
  if [ -n "${FGPU_E2E_BIN_FROM:-}" ]; then
    # Prebuilt binaries (e.g. another commit's, to compare builds in one cluster session).
    target="$FGPU_E2E_BIN_FROM"
  else
    (cd "$E2E_LIB_DIR/../.." && cargo build -q "${flags[@]}" -p fgpu-kubelet-plugin --bin fgpu-kubelet-plugin --example dra_call) >&2 \
      || fail "cargo build -p fgpu-kubelet-plugin failed"
  fi
  work="$(mktemp -d "/tmp/fgpu-e2e-$1.XXXXXX")"
  mkdir -p "$work/bin"
  local src
  for f in fgpu-kubelet-plugin examples/dra_call libfgpu.so libfgpu_fake_cuda.so; do
    src="$target/$f"
    [ -f "$src" ] || src="$target/${f##*/}" # a flat directory of prebuilt binaries
    [ -f "$src" ] || fail "$target/$f is missing: build the workspace first (make build)"
    cp "$src" "$work/bin/"
  done
  export FGPU_E2E_BIN_DIR="$work/bin"
  run_dir="$work/run"
  [ -z "${FGPU_CLUSTER_RUN:-}" ] || run_dir="$FGPU_CLUSTER_RUN/plugin-${work##*/}"
  export FGPU_E2E_RUN_DIR="$run_dir"
  # shellcheck disable=SC2034 # for the sourcing script
  dra_call="$work/bin/dra_call"
}
start_plugin() {
  plugin_pid="$("$E2E_LIB_DIR/30-dra-quota/plugin.sh" "$work")"
  say "plugin started (pid $plugin_pid)"
}
plugin_up() {
  classes | kubectl apply -f - >&2
  start_plugin
  wait_registered 1
  wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get resourceslice "$PLUGIN_SLICE"
}
stop_plugin() {
  [ -n "$plugin_pid" ] || return 0
  kill -TERM "$plugin_pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$plugin_pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$plugin_pid" 2>/dev/null || true
  wait "$plugin_pid" 2>/dev/null || true
  plugin_pid=""
}
wait_registered() {
  wait_until 30 "plugin registered with the kubelet ($1)" \
    sh -c "[ \"\$(grep -c 'registered with the kubelet' $work/plugin.log)\" -ge $1 ]"
}
one_gpu_node() {
  cat >"$work/gpus.yaml" <<YAML
nodes:
  - name: $NODE_NAME
    deviceRoot: /run/fgpu-e2e/dev
    gpus:
      - uuid: $1
        productName: NVIDIA H100 80GB HBM3
        memory: 80Gi
        smCount: 132
        computeCapability: "9.0"
YAML
  export FGPU_E2E_FAKE_GPUS="$work/gpus.yaml"
}
fake_state_setup() {
  mkdir -p "$1"
  chmod 0755 "$1"
  local f
  for f in gpu gpu.procs gpu.live gpu.limits gpu.gpus; do : >"$1/$f"; chmod 0666 "$1/$f"; done
}
plugin_cleanup() {
  local rc="$1"
  stop_plugin
  kubectl delete resourceslice "$PLUGIN_SLICE" --ignore-not-found >/dev/null 2>&1 || true
  if [ "$rc" -ne 0 ] && [ -n "$work" ]; then
    say "plugin log (last 40 lines):"; tail -40 "$work/plugin.log" 2>/dev/null | sed 's/^/      /' >&2
  fi
  [ -z "$run_dir" ] || rm -rf "$run_dir"
  [ -z "$work" ] || rm -rf "$work"
}
alloc_patch() {
  cat <<JSON
{"status": {"allocation": {"devices": {
  "results": [{"request": "gpu", "driver": "$PLUGIN_DRIVER", "pool": "$NODE_NAME", "device": "$1"}],
  "config": [{"source": "FromClaim", "opaque": {"driver": "$PLUGIN_DRIVER",
    "parameters": {"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": "512Mi"}}}]}}}}
JSON
}
allocated_claim() {
  kubectl apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: $E2E_NS}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: shared.gpu.fgpu.dev}
YAML
  kubectl -n "$E2E_NS" patch resourceclaim "$1" --subresource=status --type=merge -p "$(alloc_patch "$2")" >/dev/null
  kubectl -n "$E2E_NS" get resourceclaim "$1" -o jsonpath='{.metadata.uid}'
}
shared_claim_pods() {
  local prefix="$1" n="$2" i
  {
    cat <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: share-1gi, namespace: $E2E_NS}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: shared.gpu.fgpu.dev
          capacity: {requests: {memory: 1Gi}}
YAML
    for i in $(seq 1 "$n"); do
      cat <<YAML
---
apiVersion: v1
kind: Pod
metadata: {name: $prefix-$i, namespace: $E2E_NS, labels: {app: $prefix}}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: gpu, resourceClaimTemplateName: share-1gi}]
  securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
  containers:
  - name: c
    image: $FGPU_WORKLOAD_IMAGE
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "exec sleep 3600"]
    resources: {claims: [{name: gpu}]}
YAML
    done
  } | kubectl apply -f - >/dev/null
}
checkpoint_uids() { find "$run_dir/checkpoint" -maxdepth 1 -name '*.json' -printf '%f\n' 2>/dev/null | sed 's/\.json$//' | sort; }
cdi_spec_uids() { find "$CDI_SPEC_DIR" -maxdepth 1 -name "$PLUGIN_DRIVER-claim_*.json" -printf '%f\n' | sed "s/^$PLUGIN_DRIVER-claim_//; s/\.json\$//" | sort; }
claim_dir_uids() { find "$run_dir/claims" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort; }
mig_node() {
  awk -v gpu="- uuid: $2" 'index($0, gpu) {print; print "        migCapable: true"; print "        mode: mig"; next} {print}' \
    "$1" >"$work/node.yaml"
  grep -q "mode: mig" "$work/node.yaml" || fail "could not put GPU $2 in mode mig in $work/node.yaml"
  mig_state="$work/node.yaml.mig.json"
  local gi n caps=/run/fgpu-e2e/dev/nvidia-caps
  mkdir -p "$caps"
  for gi in $(seq 1 14); do
    for n in $((3 + 9 * gi)) $((4 + 9 * gi)); do
      [ -c "$caps/nvidia-cap$n" ] || mknod -m 0666 "$caps/nvidia-cap$n" c 1 3
    done
  done
}
mig_instances() { mig_state_list placement; }
mig_instance_uuids() { mig_state_list uuid; }
mig_instances_are() { [ "$(mig_instances)" = "$1" ]; }
# mig_state_list placement|uuid: each instance in $mig_state by its placement or its UUID.
mig_state_list() {
  [ -f "$mig_state" ] || return 0
  python3 -c 'import json,sys
name = (lambda i: i["uuid"]) if sys.argv[2] == "uuid" else (lambda i: i["profile"] + "@" + str(i["placement"]["start"]))
d = json.load(open(sys.argv[1]))
print(" ".join(sorted(name(i) for l in d["gpus"].values() for i in l)))' "$mig_state" "$1"
}
sampler_start() {
  ( while :; do
      if g="$("$@")"; then echo "$(date +%s) $g" >>"$work/grants.log"; fi
      sleep 0.2
    done ) &
  sampler=$!
}
sampler_stop() {
  [ -n "$sampler" ] || return 0
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  sampler=""
}
# sampled_max <key>: the largest <key>=<n> in $work/grants.log.
sampled_max() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" "$work/grants.log" | sort -n | tail -1; }
assert_no_overgrant() {
  local shares="$1" bytes="$2" key="$3" what="$4" claims="$5" samples
  sampler_stop
  samples="$(wc -l <"$work/grants.log")"
  [ "$samples" -ge 5 ] || fail "only $samples samples of the books"
  say "books sampled $samples times: at most $(sampled_max claims) claims, $(sampled_max memory) bytes, $(sampled_max "$key") $what"
  [ "$(sampled_max claims)" -le "$shares" ] \
    || fail "more than $shares claims on gpu-0: $(grep -v "claims=[0-$shares] " "$work/grants.log" | head -3)"
  [ "$(sampled_max memory)" -le "$bytes" ] || fail "more than $bytes bytes granted on gpu-0"
  [ "$(sampled_max "$key")" -le "$shares" ] || fail "more than $shares $what"
  [ "$(sampled_max claims)" -ge "$claims" ] || fail "the sampler never saw the $claims claims (max $(sampled_max claims))"
  say "ok: never more than $shares shares ($((bytes >> 30))Gi) granted"
}
obj_json() { kubectl -n "$E2E_NS" get "$1" -o json >"$work/obj.json" 2>/dev/null && echo "$work/obj.json"; }
# pod_claims <kubectl get pods args...>: "<pod> <its claim>" of each pod listed, one a line.
pod_claims() {
  local p
  for p in $(kubectl -n "$E2E_NS" get pods "$@" -o name); do
    echo "$p $(jp "$p" '{.status.resourceClaimStatuses[0].resourceClaimName}')"
  done
}
claim_uids_of() {
  local p c
  while read -r p c <&3; do
    [ -z "$c" ] || { jp "resourceclaims.resource.k8s.io/$c" '{.metadata.uid}'; echo; }
  done 3< <(pod_claims "$@") | sort
}
assert_share_claims() {
  local dev="$1" mem="$2" p c
  shift 2
  while read -r p c <&3; do
    assert_eq "$p claim $c" "$PLUGIN_DRIVER/$NODE_NAME/$dev $mem" \
      "$(python3 "$PLUGIN_BOOKS" claim "$(obj_json "resourceclaims.resource.k8s.io/$c")")"
  done 3< <(pod_claims "$@")
}
without() { comm -23 <(printf '%s\n' "$1") <(printf '%s\n' "$2"); }
records_are() { [ "$(checkpoint_uids)" = "$1" ]; }
none_recorded() { [ "$(without "$1" "$(checkpoint_uids)")" = "$1" ]; }
