#!/usr/bin/env bash
# Scenario (issue 24): Volcano reclaims GPU memory from a research queue for production.
# Volcano's own vGPU device sharing places the pods (hack/volcano-install.sh with
# FGPU_VOLCANO_VGPU=1: deviceshare with deviceshare.VGPUEnable; actions with reclaim), and
# fgpu's device plugin in its Volcano mode (--scheduler volcano, host process against the
# kubelet, one fake 80 GiB GPU) registers the node in Volcano's annotations and enforces each
# allocation (docs/platforms.md, "Volcano with reclaim"). The pods ask for
# volcano.sh/vgpu-number 1, vgpu-memory 20000 (MiB), vgpu-cores 25: Volcano's queues count those
# like any resource, so reclaim works (it does not for DRA claims: 81-volcano-queues).
#
#   1. The node: vgpu-number 10, vgpu-memory 81920, vgpu-cores 100 allocatable; the register
#      annotation lists the GPU; the scheduler's handshake is answered.
#   2. research (weight 1, reclaimable) runs train-research, 4 pods of 20000 MiB: all Running,
#      each with Volcano's allocation (written by field manager vc-scheduler), bind phase
#      success, cuMemGetInfo and NVML showing 20000 MiB in the container, and its limits file
#      on the node.
#   3. production (weight 3, not reclaimable) submits serve-production, 2 pods of 20000 MiB
#      (minAvailable 2). The GPU has 1920 MiB free; Volcano's reclaim evicts research pods
#      (research holds 80000 MiB, above its deserved part). Both production pods run, each
#      seeing 20000 MiB; the evicted pods' fgpu records and limits files are gone from the
#      node; never more than 4 containers' grants (80000 MiB) on the GPU.
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../legacy-lib.sh"
root="$E2E_LIB_DIR/../.."
GPU="GPU-e2e83000-0000-4000-8000-000000000000"
mib=20000
sampler=""
qs=queues.scheduling.volcano.sh

cleanup() {
  local rc=$?
  kubectl -n "$E2E_NS" delete jobs.batch.volcano.sh --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  (cd "$root" && hack/volcano-uninstall.sh) >&2 || true
  kubectl delete "$qs" production research --ignore-not-found >/dev/null 2>&1 || true
  kubectl annotate node "$NODE_NAME" volcano.sh/node-vgpu-register- volcano.sh/node-vgpu-handshake- >/dev/null 2>&1 || true
  for r in vgpu-memory vgpu-cores; do
    kubectl patch node "$NODE_NAME" --subresource=status --type=json \
      -p "[{\"op\":\"remove\",\"path\":\"/status/capacity/volcano.sh~1$r\"}]" >/dev/null 2>&1 || true
  done
  legacy_cleanup "$rc"
}
trap cleanup EXIT
plugin_setup 83
mkdir -p /run/fgpu-e2e/dev
for n in nvidia0 nvidiactl nvidia-uvm nvidia-uvm-tools; do
  [ -c "/run/fgpu-e2e/dev/$n" ] || mknod -m 0666 "/run/fgpu-e2e/dev/$n" c 1 3
done
cat >"$work/node.yaml" <<YAML
defaults: {driverVersion: "550.54.15", cudaVersion: "12.4"}
nodes:
  - name: $NODE_NAME
    deviceRoot: /run/fgpu-e2e/dev
    gpus:
      - {uuid: $GPU, productName: NVIDIA A100-SXM4-80GB, memory: 81920Mi, smCount: 108,
         computeCapability: "8.0", numaNode: 0, pciBusID: "0000:19:00.0"}
YAML
dp_run="$work/dp-run"
t="$work/bin" libdir=/usr/lib/x86_64-linux-gnu
legacy_start device-plugin env MALLOC_ARENA_MAX=2 RUST_LOG="${FGPU_E2E_PLUGIN_LOG:-info}" \
  "$t/fgpu-kubelet-plugin" device-plugin --scheduler volcano \
  --node "$NODE_NAME" --backend fake --fake-gpus "$work/node.yaml" \
  --device-plugin-path "$KUBELET_DEVICE_PLUGINS_DIR" \
  --cdi-root "$CDI_SPEC_DIR" --state-dir "$work/dp-state" --run-dir "$dp_run" \
  --shim-library "$t/libfgpu.so" \
  --driver-file "$t/libfgpu_fake_cuda.so:$libdir/libcuda.so.1" \
  --driver-file "$t/libfgpu_fake_cuda.so:$libdir/libnvidia-ml.so.1" \
  --health-seconds 2 --resync-seconds 2 --metrics-address "$LEGACY_DP_METRICS_ADDR"
wait_until 30 "device plugin registered with the kubelet" grep -q 'registered with the kubelet' "$work/device-plugin.log"

# --- 1. the node as Volcano sees it
for r in "vgpu-number 10" "vgpu-memory 81920" "vgpu-cores 100"; do
  read -r name want <<<"$r"
  wait_until 60 "node allocatable volcano.sh/$name = $want" jp_eq "node/$NODE_NAME" "{.status.allocatable.volcano\.sh/$name}" "$want" ""
  say "ok: node allocatable volcano.sh/$name = $want"
done
reg="$(jp "node/$NODE_NAME" '{.metadata.annotations.volcano\.sh/node-vgpu-register}' "")"
assert_eq "register annotation" "$GPU,10,81920,NVIDIA A100-SXM4-80GB,true,hami-core:" "$reg"

t0=$SECONDS
(cd "$root" && FGPU_VOLCANO_VGPU=1 FGPU_VOLCANO_ACTIONS="enqueue, allocate, backfill, reclaim" hack/volcano-install.sh) >&2
say "volcano running with vGPU and reclaim in $((SECONDS - t0))s"
grep -q 'deviceshare.VGPUEnable: true' "${FGPU_CLUSTER_STATE:-/var/lib/fgpu-cluster}/volcano/scheduler.yaml" || fail "scheduler.yaml has no deviceshare vGPU"
handshake() { jp "node/$NODE_NAME" '{.metadata.annotations.volcano\.sh/node-vgpu-handshake}' ""; }
wait_until 60 "the scheduler asks the node (handshake Requesting_)" sh -c "kubectl get node $NODE_NAME -o jsonpath='{.metadata.annotations.volcano\.sh/node-vgpu-handshake}' | grep -q '^Requesting_'"
say "ok: handshake $(handshake)"

kubectl apply -f - >&2 <<YAML
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: production}
spec: {weight: 3, reclaimable: false}
---
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: research}
spec: {weight: 1, reclaimable: true}
YAML
for q in production research; do
  wait_until 60 "queue $q open" jp_eq "$qs/$q" '{.status.state}' Open ""
done

# vcjob <name> <queue> <replicas> <minAvailable>: each pod one vGPU of $mib MiB and 25 %,
# running fgpu-probe, then waiting.
vcjob() {
  kubectl -n "$E2E_NS" apply -f - >&2 <<YAML
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: $1}
spec:
  schedulerName: volcano
  queue: $2
  minAvailable: $4
  tasks:
  - name: worker
    replicas: $3
    template:
      spec:
        restartPolicy: Never
        terminationGracePeriodSeconds: 1
        securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
        containers:
        - name: main
          image: $FGPU_WORKLOAD_IMAGE
          imagePullPolicy: Never
          command: ["/bin/sh", "-c", "/usr/local/bin/fgpu-probe --step-mib 1000 --max-gib 96; echo probe_done; exec sleep 3600"]
          resources:
            limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: $mib, volcano.sh/vgpu-cores: 25}
YAML
}
sel() { echo "volcano.sh/job-name=$1"; }
running_of() { kubectl -n "$E2E_NS" get pods -l "$(sel "$1")" --field-selector=status.phase=Running -o name | wc -l; }
uids_of() { kubectl -n "$E2E_NS" get pods -l "$(sel "$1")" --field-selector=status.phase=Running -o jsonpath='{range .items[*]}{.metadata.uid}{"\n"}{end}' | sort; }
claims_on_node() { find "$dp_run/claims" -mindepth 1 -maxdepth 1 -name '*-main' 2>/dev/null | wc -l; }
# The books on the node: never more than 4 containers' grants (80000 MiB of 81920) at once.
( while :; do echo "$(date +%s) $(claims_on_node)" >>"$work/claims.log"; sleep 0.2; done ) &
sampler=$!
trap 'kill $sampler 2>/dev/null || true; cleanup' EXIT

check_pod() { # check_pod <pod>: Volcano's allocation, bind phase, the quota in the container and on the node
  local p="$1" uid ids mgr
  uid="$(jp "pod/$p" '{.metadata.uid}')"
  ids="$(jp "pod/$p" '{.metadata.annotations.volcano\.sh/vgpu-ids-new}')"
  assert_eq "$p allocation" "$GPU,NVIDIA,$mib,25:" "$ids"
  mgr="$(kubectl -n "$E2E_NS" get pod "$p" -o json --show-managed-fields | py_json "' '.join(sorted(e['manager'] for e in d['metadata']['managedFields'] if 'f:volcano.sh/vgpu-ids-new' in e.get('fieldsV1', {}).get('f:metadata', {}).get('f:annotations', {})))")"
  assert_eq "$p allocation written by" vc-scheduler "$mgr"
  wait_until 30 "$p bind phase success" jp_eq "pod/$p" '{.metadata.annotations.volcano\.sh/bind-phase}' success
  wait_probe "$p"
  assert_eq "$p cuMemGetInfo total (MiB)" "$mib" "$(probe_field "$p" cuda_total_mib)"
  assert_eq "$p NVML total (MiB)" "$mib" "$(probe_field "$p" nvml_total_mib)"
  assert_eq "$p allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(probe_field "$p" next_alloc_result)"
  grep -qx "gpu.$GPU.memory=$((mib << 20))" "$dp_run/claims/$uid-main/limits" \
    || fail "$p: no memory=$((mib << 20)) in $dp_run/claims/$uid-main/limits: $(cat "$dp_run/claims/$uid-main/limits" 2>&1)"
  grep -qx "gpu.$GPU.cores=25" "$dp_run/claims/$uid-main/limits" || fail "$p: no cores=25 in its limits file"
  say "ok: $p limits file on the node: $mib MiB, 25 %"
}

# --- 2. research fills the GPU
t0=$SECONDS
vcjob train-research research 4 1
wait_until 180 "train-research: 4 pods Running" sh -c "[ \$(kubectl -n $E2E_NS get pods -l $(sel train-research) --field-selector=status.phase=Running -o name | wc -l) -eq 4 ]"
say "ok: research's 4 pods Running in $((SECONDS - t0))s"
for p in $(kubectl -n "$E2E_NS" get pods -l "$(sel train-research)" -o jsonpath='{.items[*].metadata.name}'); do
  check_pod "$p"
done
before="$(uids_of train-research)"

# --- 3. production arrives: Volcano reclaims
t0=$SECONDS
vcjob serve-production production 2 2
wait_until 240 "serve-production: 2 pods Running (reclaimed from research)" sh -c "[ \$(kubectl -n $E2E_NS get pods -l $(sel serve-production) --field-selector=status.phase=Running -o name | wc -l) -eq 2 ]"
say "ok: production's 2 pods Running $((SECONDS - t0))s after submission"
after="$(uids_of train-research)"
evicted="$(comm -23 <(echo "$before") <(echo "$after"))"
n="$(echo "$evicted" | grep -c . || true)"
[ "$n" -ge 2 ] || fail "expected at least 2 research pods evicted, got $n (before: $before; after: $after)"
say "ok: $n research pods evicted; research runs $(running_of train-research)"
vclog="${FGPU_CLUSTER_LOGS:-$root/_out/logs}/vc-scheduler.log"
if grep -q 'Considering reclaim\|Try to reclaim' "$vclog" 2>/dev/null; then say "ok: the scheduler log shows reclaim"; fi
for u in $evicted; do
  wait_until 30 "evicted pod $u: its fgpu record and limits gone" sh -c "[ ! -e $dp_run/claims/$u-main ] && [ ! -e $dp_run/checkpoint/$u-main.json ]"
done
say "ok: the evicted pods' claim directories and records are gone from the node"
for p in $(kubectl -n "$E2E_NS" get pods -l "$(sel serve-production)" -o jsonpath='{.items[*].metadata.name}'); do
  check_pod "$p"
done
kill "$sampler" 2>/dev/null || true
peak="$(awk '{print $2}' "$work/claims.log" | sort -n | tail -1)"
[ "${peak:-0}" -le 4 ] || fail "the node held $peak containers' grants of $mib MiB at once (GPU: 81920 MiB)"
say "ok: at most $peak grants of $mib MiB on the GPU at any sample ($(wc -l <"$work/claims.log") samples)"
