#!/usr/bin/env bash
# Scenario: the legacy path (no DRA) end to end with HAMi's documented pod specs, on every
# release (1.31 without DRA; 1.37 with DRA on, where the device plugin path works as well).
# Real: kube-apiserver, a second kube-scheduler (profile fgpu-scheduler) calling
# fgpu-controller extender (/filter, /prioritize, /bind), the kubelet calling
# fgpu-kubelet-plugin device-plugin (Register, ListAndWatch, Allocate answered with CDI
# device ids), containerd applying the CDI spec, libfgpu.so in the container. Fake: the two
# GPUs (tests/e2e/legacy-node.yaml: an H100 and an A100) and the CUDA driver in the image.
#
# Asserted: the kubelet registers nvidia.com/gpu (2 GPUs x 10); the node inventory
# annotation lists both GPUs; the pods (3000 MiB + 30 % cores; 50 % of the memory) are bound
# by the extender to fgpu-node with a decision annotation that says what they asked for
# (default GPU policy spread: one pod per GPU); each container sees exactly its grant in
# cuMemGetInfo and NVML, is refused with CUDA_ERROR_OUT_OF_MEMORY past it, has its limits
# file (memory and core quota) and HAMi-core's variables, and only its GPU's device node; the
# device plugin's /metrics counts both containers prepared and passes promtool check metrics;
# the extender's counts two binds, no pod pending, and passes promtool too.
source "$(dirname "$0")/../lib.sh"
source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../legacy-lib.sh"
trap 'legacy_cleanup $?' EXIT
legacy_setup 50
legacy_up
say "ok: the kubelet advertises nvidia.com/gpu = $(kubectl get node "$NODE_NAME" -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}')"

inv="$(node_inventory "$NODE_NAME")"
assert_eq "inventory GPUs (id uuid model memoryBytes)" \
  "gpu-0 GPU-e2e1e9ac-0000-4000-8000-000000000000 NVIDIA H100 80GB HBM3 85520809984;gpu-1 GPU-e2e1e9ac-0000-4000-8000-000000000001 NVIDIA A100-SXM4-80GB 85899345920" \
  "$(py_json "';'.join(' '.join(str(g[k]) for k in ('id', 'uuid', 'model', 'memoryBytes')) for g in d)" <<<"$inv")"

legacy_apply "$E2E_DIR/pods.yaml"
t0=$SECONDS
for p in gpu-pod gpu-pod-percentage; do wait_probe "$p"; done
say "both probes done $((SECONDS - t0))s after the pods were created"
for p in gpu-pod gpu-pod-percentage; do kubectl -n "$E2E_NS" logs "$p" | sed "s/^/      $p: /" >&2; done

for p in gpu-pod gpu-pod-percentage; do
  assert_eq "$p scheduler" fgpu-scheduler "$(jp "pod/$p" '{.spec.schedulerName}')"
  assert_eq "$p bound to" "$NODE_NAME" "$(jp "pod/$p" '{.spec.nodeName}')"
  assert_eq "$p decision node" "$NODE_NAME" "$(decision_field "$p" 'd["node"]')"
  assert_eq "$p decision container" "0 ubuntu-container 1" \
    "$(decision_field "$p" '" ".join(str(x) for x in (d["containers"][0]["index"], d["containers"][0]["name"], len(d["containers"][0]["devices"])))')"
done
dev() { decision_field "$1" "d[\"containers\"][0][\"devices\"][0][\"$2\"]"; }
assert_eq "gpu-pod granted memory (bytes)" $((3000 << 20)) "$(dev gpu-pod memoryBytes)"
assert_eq "gpu-pod granted cores" 30 "$(dev gpu-pod cores)"
gpu1="$(dev gpu-pod id)" gpu2="$(dev gpu-pod-percentage id)"
[ "$gpu1" != "$gpu2" ] || fail "both pods on $gpu1: the default GPU policy (spread) puts them on different GPUs"
say "ok: spread by default: gpu-pod on $gpu1, gpu-pod-percentage on $gpu2"
cap2="$(py_json "[g['memoryBytes'] for g in d if g['id'] == '$gpu2'][0]" <<<"$inv")"
assert_eq "gpu-pod-percentage granted memory (50 % of $gpu2)" $((cap2 / 2)) "$(dev gpu-pod-percentage memoryBytes)"
assert_eq "gpu-pod-percentage cores (none asked: no core quota)" 0 "$(dev gpu-pod-percentage cores)"

# What each container sees.
check_quota() { # check_quota <pod> <granted bytes>
  local p="$1" mib=$(($2 >> 20))
  assert_eq "$p preload (from the CDI spec)" /usr/lib/fgpu/libfgpu.so "$(probe_field "$p" ld_so_preload)"
  assert_eq "$p cuMemGetInfo total (MiB)" "$mib" "$(probe_field "$p" cuda_total_mib)"
  assert_eq "$p NVML total (MiB)" "$mib" "$(probe_field "$p" nvml_total_mib)"
  assert_eq "$p allocated before refusal (MiB, 100 MiB steps)" $((mib / 100 * 100)) "$(probe_field "$p" allocated_mib)"
  assert_eq "$p allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(probe_field "$p" next_alloc_result)"
}
check_quota gpu-pod $((3000 << 20))
check_quota gpu-pod-percentage "$(dev gpu-pod-percentage memoryBytes)"
limits="$(kubectl -n "$E2E_NS" exec gpu-pod -- sh -c 'cat /etc/fgpu/claims/*/limits')"
say "gpu-pod /etc/fgpu/claims/*/limits: $(tr '\n' ' ' <<<"$limits")"
grep -qx "gpu\.GPU-[0-9a-f-]*\.memory=$((3000 << 20))" <<<"$limits" || fail "gpu-pod limits file has no gpu.<uuid>.memory=$((3000 << 20))"
grep -qx "gpu\.GPU-[0-9a-f-]*\.cores=30" <<<"$limits" || fail "gpu-pod limits file has no gpu.<uuid>.cores=30"
say "ok: gpu-pod limits file: memory $((3000 << 20)) bytes, cores 30 %"
envs="$(kubectl -n "$E2E_NS" exec gpu-pod -- env)"
for kv in CUDA_DEVICE_MEMORY_LIMIT=3000m CUDA_DEVICE_SM_LIMIT=30 FGPU_CORE_LIMIT=30; do
  grep -qx "$kv" <<<"$envs" || fail "gpu-pod environment lacks $kv: $(echo "$envs" | grep -E 'FGPU|CUDA' | tr '\n' ' ')"
done
say "ok: gpu-pod environment has HAMi-core's CUDA_DEVICE_MEMORY_LIMIT=3000m and CUDA_DEVICE_SM_LIMIT=30"
# Only the granted GPU's device node (gpu-<minor> = /dev/nvidia<minor>).
for p in gpu-pod gpu-pod-percentage; do
  g="$(dev "$p" id)"
  assert_eq "$p GPU device nodes" "/dev/nvidia${g#gpu-}" "$(kubectl -n "$E2E_NS" exec "$p" -- sh -c 'ls /dev/nvidia[0-9]*' | tr '\n' ' ' | sed 's/ $//')"
done
# The device plugin's answer was CDI: one spec per container, named after pod UID + container.
uid="$(jp pod/gpu-pod '{.metadata.uid}')"
spec="$CDI_SPEC_DIR/gpu.fgpu.dev-claim_$uid-ubuntu-container.json"
[ -f "$spec" ] || fail "no CDI spec $spec: $(ls "$CDI_SPEC_DIR")"
say "ok: CDI spec $(basename "$spec")"

# The device plugin's /metrics (--metrics-address): both containers prepared, gpu-pod's grant
# on its GPU, and an exposition promtool accepts.
uuid1="$(py_json "[g['uuid'] for g in d if g['id'] == '$gpu1'][0]" <<<"$inv")"
m="$(curl -fsS "http://$LEGACY_DP_METRICS_ADDR/metrics")" || fail "device plugin: no /metrics on $LEGACY_DP_METRICS_ADDR"
assert_eq "device plugin fgpu_kubelet_plugin_prepared_claims" 2 \
  "$(sed -n 's/^fgpu_kubelet_plugin_prepared_claims //p' <<<"$m")"
assert_eq "device plugin fgpu_kubelet_plugin_gpu_granted_memory_bytes on $uuid1 (gpu-pod's)" $((3000 << 20)) \
  "$(sed -n "s/^fgpu_kubelet_plugin_gpu_granted_memory_bytes{gpu_uuid=\"$uuid1\"} //p" <<<"$m")"
# shellcheck source=hack/lib.sh
command -v promtool >/dev/null || (source "$E2E_LIB_DIR/../../hack/lib.sh" && ensure_pkgs prometheus)
# The page as a reader without an OpenMetrics Accept header gets it (text 0.0.4, what
# promtool parses; Prometheus asks for and gets OpenMetrics).
lint="$(promtool check metrics <<<"$m" 2>&1)" || fail "device plugin /metrics: promtool check metrics: $lint"
say "ok: device plugin /metrics: $(grep -c '^fgpu_' <<<"$m") series, prepared_claims 2, promtool check metrics clean"

# The extender's /metrics (--metrics-address): each pod filtered and bound once (binds can
# only succeed once per pod: a second is refused as already bound), admitted by its webhook,
# nothing left pending, and an exposition promtool accepts.
em="$(curl -fsS "http://$LEGACY_EXTENDER_METRICS_ADDR/metrics")" || fail "extender: no /metrics on $LEGACY_EXTENDER_METRICS_ADDR"
series() { sed -n "s/^$1 //p" <<<"$em"; }
assert_eq "extender binds ok" 2 "$(series 'fgpu_extender_requests_total{verb="bind",result="ok"}')"
[ "$(series 'fgpu_extender_requests_total{verb="filter",result="ok"}')" -ge 2 ] \
  || fail "extender: fewer than 2 passing filters: $(grep '^fgpu_extender_requests_total' <<<"$em" | tr '\n' ' ')"
[ "$(series 'fgpu_extender_admissions_total{webhook="mutate_pods",result="mutated"}')" -ge 2 ] \
  || fail "extender: fewer than 2 pods mutated by its webhook: $(grep '^fgpu_extender_admissions_total' <<<"$em" | tr '\n' ' ')"
for r in no_fit no_gpu_node invalid; do
  assert_eq "extender pods pending ($r)" 0 "$(series "fgpu_extender_pods_pending{reason=\"$r\"}")"
done
assert_eq "extender nodes with inventory" 1 "$(series fgpu_extender_nodes)"
# The filter cache (on by default): every filter request looked at the one GPU node, each
# time either reused from its kept result or evaluated; the first was evaluated.
f_ok="$(series 'fgpu_extender_requests_total{verb="filter",result="ok"}')"
f_reused="$(series 'fgpu_extender_filter_cache_nodes_total{verb="filter",result="reused"}')"
f_evaluated="$(series 'fgpu_extender_filter_cache_nodes_total{verb="filter",result="evaluated"}')"
if [ "${f_evaluated:-0}" -lt 1 ] || [ $((${f_reused:-0} + ${f_evaluated:-0})) -lt "$f_ok" ]; then
  fail "extender filter cache: reused ${f_reused:-none} + evaluated ${f_evaluated:-none} nodes for $f_ok passing filters"
fi
[ "$(series 'fgpu_extender_request_duration_seconds_count{verb="bind"}')" -ge 2 ] || fail "extender: bind latency not observed"
lint="$(promtool check metrics <<<"$em" 2>&1)" || fail "extender /metrics: promtool check metrics: $lint"
say "ok: extender /metrics: binds ok 2, $(grep -c '^fgpu_extender_' <<<"$em") series, promtool check metrics clean"

kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >&2
wait_until 30 "CDI specs of the deleted pods removed (device plugin resync)" sh -c "[ ! -e $spec ]"
say "ok: the device plugin removed the files of the deleted pods"
