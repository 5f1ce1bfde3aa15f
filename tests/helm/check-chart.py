#!/usr/bin/env python3
"""Structural checks of the fgpu chart's rendered manifests (hack/helm-check.sh runs it).

    check-chart.py HELM CHART

Renders the chart with `helm template` for a set of values and Kubernetes versions and
asserts the shapes the security review asked for, each of which a wrong template would
break: the gate webhook sees only pods with resourceClaims; in controller mode the shared
DeviceClass matches no device for kube-scheduler; the extender's /bind is on the pod's
loopback beside the fgpu kube-scheduler; the legacy grant webhook is registered for CREATE
and UPDATE; the HAMi pods webhook renders only when asked, with what it needs (flag, RBAC,
caBundle) and never beside the legacy path; the VAPs bind the node daemons to their token's node; the controller has a PDB;
production renders name no fake CUDA; the monitoring objects render only when asked, select
the chart's Service and pods like deploy/monitoring's and carry the files/monitoring/ files
unchanged; the research class selects only research-tier GPUs and the production classes
keep off them; values the schema refuses are refused.
Prints one line per check and "N passed, 0 failed"; exits 1 on the first failure.
"""
import json
import os
import subprocess
import sys

import yaml

HELM, CHART = sys.argv[1], sys.argv[2]
passed = 0


def render(version, *sets, values=None, ok=True):
    cmd = [HELM, "template", "fgpu", CHART, "-n", "fgpu-system", "--kube-version", version]
    if values:
        cmd += ["-f", values]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if not ok:
        return p
    if p.returncode != 0:
        fail(f"helm template {' '.join(sets)} on {version}: {p.stderr.strip()}")
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def fail(msg):
    print(f"FAIL: {msg}")
    print(f"{passed} passed, 1 failed")
    sys.exit(1)


def check(cond, msg):
    global passed
    if not cond:
        fail(msg)
    passed += 1
    print(f"ok: {msg}")


def get(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    return None


def containers(d):
    return d["spec"]["template"]["spec"]["containers"]


# --- default values on 1.37: capacity mode
d = render("1.37.2")
shared = get(d, "DeviceClass", "shared.gpu.fgpu.dev")
check(shared and 'type == "gpu"' in shared["spec"]["selectors"][0]["cel"]["expression"],
      "1.37 auto = capacity: the shared class selects the driver's GPUs")
check(get(d, "MutatingWebhookConfiguration", "fgpu-allocation-gate") is None,
      "capacity mode: no allocation gate webhook")
research = get(d, "DeviceClass", "research.gpu.fgpu.dev")
check(research and 'tier == "research"' in research["spec"]["selectors"][0]["cel"]["expression"]
      and research["spec"]["config"][0]["opaque"]["parameters"].get("oversubscribe") is True,
      "the research class selects research-tier GPUs and sets oversubscribe: true")
check(all('tier != "research"' in get(d, "DeviceClass", n)["spec"]["selectors"][0]["cel"]["expression"]
          for n in ("gpu.fgpu.dev", "shared.gpu.fgpu.dev")),
      "the whole and shared classes keep off research-tier GPUs")
check("--oversubscribe=0=1.5" in containers(get(render("1.37.2", "kubeletPlugin.oversubscribe=0=1.5"),
                                                "DaemonSet", "fgpu-kubelet-plugin"))[0]["args"],
      "kubeletPlugin.oversubscribe reaches the plugin's --oversubscribe")
check(render("1.37.2", "kubeletPlugin.oversubscribe=lots", ok=False).returncode != 0,
      "the schema refuses an oversubscribe ratio that is not a decimal")
ctl = get(d, "Deployment", "fgpu-controller")
check(ctl["spec"]["replicas"] == 2 and "--mode=capacity" in containers(ctl)[0]["args"],
      "controller: 2 replicas, --mode=capacity")
check(get(d, "PodDisruptionBudget", "fgpu-controller")["spec"]["minAvailable"] == 1, "controller PDB minAvailable 1")
check(all(a in containers(ctl)[0]["args"] for a in ("--leader-election-lease-seconds=12", "--leader-election-renew-seconds=4",
                                                    "--leader-election-retry-seconds=2")), "leader-election timings from values")
vol = [v for v in ctl["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"][0]
check([i["key"] for i in vol["secret"]["items"]] == ["tls.crt", "tls.key"],
      "the controller mounts the serving pair only, not the CA key")
ds = get(d, "DaemonSet", "fgpu-kubelet-plugin")
img = containers(ds)[0]["image"]
check("fake" not in img and all("fake" not in a for a in containers(ds)[0]["args"]),
      f"production node image {img} and args name no fake CUDA")
check(containers(ds)[0]["securityContext"].get("privileged") is True, "NVML backend: privileged (device nodes)")
vap = get(d, "ValidatingAdmissionPolicy", "fgpu-kubelet-plugin-own-node")
check(vap is not None and "authentication.kubernetes.io/node-name" in vap["spec"]["variables"][0]["expression"] and "has(request.userInfo.extra)" in vap["spec"]["variables"][0]["expression"],
      "VAP: the kubelet plugin's slices are tied to its token's node")
check(vap["spec"]["matchConditions"][0]["expression"].endswith('"system:serviceaccount:fgpu-system:fgpu-kubelet-plugin"'),
      "VAP matches the plugin's ServiceAccount in the release namespace")
check(get(d, "ValidatingAdmissionPolicyBinding", "fgpu-kubelet-plugin-own-node")["spec"]["validationActions"] == ["Deny"],
      "VAP binding denies")
check(get(d, "ValidatingAdmissionPolicy", "fgpu-node-daemons-own-node") is not None, "VAP: node daemons write only their own Node")
job = [x for x in d if x["kind"] == "Job"][0]
args = containers({"spec": {"template": job["spec"]["template"]}})[0]["args"]
check(args[:2] == ["certs", "ensure"] and "--dns-name=fgpu-controller.fgpu-system.svc" in args
      and "--validating-webhook=fgpu-claim-config" in args, "certs Job: certs ensure for the controller Service")
check(get(d, "CronJob", "fgpu-certs") is not None, "certs CronJob renews")
check(get(d, "Secret", "fgpu-webhook-tls") is not None and "data" not in get(d, "Secret", "fgpu-webhook-tls"),
      "the certificate Secret is declared without data (uninstall removes it; upgrades keep the Job's)")
for n in ("fgpu-controller", "fgpu-kubelet-plugin", "fgpu-certs"):
    check(get(d, "NetworkPolicy", n) is not None, f"NetworkPolicy {n}")

# --- controller mode
for v in ("1.32.0", "1.37.2"):
    d = render(v, "mode=controller")
    shared = get(d, "DeviceClass", "shared.gpu.fgpu.dev")
    expr = shared["spec"]["selectors"][0]["cel"]["expression"]
    check("allocated-by-fgpu-controller" in expr and 'type == "gpu"' not in expr,
          f"{v} controller mode: the shared class matches no device for kube-scheduler")
    whole = get(d, "DeviceClass", "gpu.fgpu.dev")
    check('type == "gpu"' in whole["spec"]["selectors"][0]["cel"]["expression"], f"{v}: the whole-GPU class still selects GPUs")
    mig = get(d, "DeviceClass", "mig.gpu.fgpu.dev")
    check(mig is not None and 'type == "mig"' in mig["spec"]["selectors"][0]["cel"]["expression"],
          f"{v}: the MIG class selects MIG placements")
    check('"mig"' not in whole["spec"]["selectors"][0]["cel"]["expression"]
          and '"mig"' not in shared["spec"]["selectors"][0]["cel"]["expression"],
          f"{v}: the whole and shared classes do not select MIG placements")
    gate = get(d, "MutatingWebhookConfiguration", "fgpu-allocation-gate")
    check(gate is not None, f"{v} controller mode: gate webhook registered")
    w = gate["webhooks"][0]
    check(w["failurePolicy"] == "Fail" and w["matchConditions"][0]["expression"]
          == "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0",
          f"{v}: gate fails closed but only for pods with resourceClaims (matchConditions)")
    check(w["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "fgpu-system"],
          f"{v}: gate skips kube-system and the release namespace")
    want_api = "resource.k8s.io/v1" if v == "1.37.2" else "resource.k8s.io/v1beta1"
    check(shared["apiVersion"] == want_api, f"{v}: DeviceClass {want_api}")
check(render("1.35.0")[0] is not None and "--mode=controller" in containers(get(render("1.35.0"), "Deployment", "fgpu-controller"))[0]["args"],
      "1.35 auto = controller")
check(get(render("1.35.0"), "MutatingWebhookConfiguration", "fgpu-allocation-gate") is not None, "1.35 auto: gate registered")

# --- HAMi pods on DRA (controller.hamiPods)
check(get(render("1.37.2"), "MutatingWebhookConfiguration", "fgpu-hami-pods") is None,
      "HAMi pods webhook off by default")
d = render("1.37.2", "controller.hamiPods.enabled=true")
hp = get(d, "MutatingWebhookConfiguration", "fgpu-hami-pods")
check(hp is not None, "hamiPods: webhook registered")
w = hp["webhooks"][0]
check(w["clientConfig"]["service"]["path"] == "/mutate-pods-dra" and w["failurePolicy"] == "Fail"
      and w["sideEffects"] == "NoneOnDryRun" and w["rules"][0]["operations"] == ["CREATE"],
      "hamiPods: Pod CREATE at the controller's /mutate-pods-dra, fails closed, no side effect on dry run")
check("'nvidia.com/gpumem-percentage'" in w["matchConditions"][0]["expression"]
      and w["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "fgpu-system"]
      and w["objectSelector"]["matchExpressions"][0]["key"] == "gpu.fgpu.dev/webhook",
      "hamiPods: narrowed to pods naming HAMi's resources, outside kube-system and the release, opt-out label")
check("--hami-pods" in containers(get(d, "Deployment", "fgpu-controller"))[0]["args"],
      "hamiPods: the controller runs with --hami-pods")
job = [x for x in d if x["kind"] == "Job"][0]
check("--mutating-webhook=fgpu-hami-pods" in containers({"spec": {"template": job["spec"]["template"]}})[0]["args"],
      "hamiPods: certs Job sets its caBundle")

def certs_job_may_update_its_webhooks(d, what):
    """Every webhook configuration the certs Job is told to update is one its ClusterRole
    names (a missing name fails the Job with 403 at install, seen in e2e 82)."""
    job = [x for x in d if x["kind"] == "Job"][0]
    args = containers({"spec": {"template": job["spec"]["template"]}})[0]["args"]
    allowed = {}
    for r in get(d, "ClusterRole", "fgpu-certs")["rules"]:
        if "update" in r["verbs"]:
            for res in r["resources"]:
                allowed.setdefault(res, set()).update(r.get("resourceNames", []))
    for a in args:
        for flag, res in (("--mutating-webhook=", "mutatingwebhookconfigurations"),
                          ("--validating-webhook=", "validatingwebhookconfigurations")):
            if a.startswith(flag):
                name = a[len(flag):]
                check(name in allowed.get(res, set()), f"{what}: certs ClusterRole may update {res}/{name}")


certs_job_may_update_its_webhooks(d, "hamiPods")
certs_job_may_update_its_webhooks(render("1.37.2", "mode=controller", "controller.hamiPods.enabled=true"), "hamiPods + controller mode")
rules = get(d, "ClusterRole", "fgpu-controller")["rules"]
check(any("resourceclaimtemplates" in r["resources"] and "create" in r["verbs"] for r in rules),
      "hamiPods: the controller may create ResourceClaimTemplates")
check(not any("resourceclaimtemplates" in r["resources"] and "create" in r["verbs"]
              for r in get(render("1.37.2"), "ClusterRole", "fgpu-controller")["rules"]),
      "without hamiPods the controller may not create ResourceClaimTemplates")
p = render("1.37.2", "controller.hamiPods.enabled=true", "legacy.enabled=true", ok=False)
check(p.returncode != 0 and "choose one path" in p.stderr, "hamiPods and legacy together are refused")

# --- legacy path
d = render("1.31.0", "legacy.enabled=true", "kubeletPlugin.enabled=false", "controller.enabled=false")
ext = get(d, "Deployment", "fgpu-extender")
cs = {c["name"]: c for c in containers(ext)}
check(set(cs) == {"extender", "kube-scheduler"}, "extender and the fgpu kube-scheduler in one pod")
check("--extender-address=127.0.0.1:8888" in cs["extender"]["args"], "extender /filter /prioritize /bind on 127.0.0.1 only")
check("--extender-user=system:serviceaccount:$(POD_NAMESPACE):$(SERVICE_ACCOUNT)" in cs["extender"]["args"]
      and {e["name"] for e in cs["extender"].get("env", [])} >= {"POD_NAMESPACE", "SERVICE_ACCOUNT"},
      "only the extender's own account may write the grant annotation")
cfg = yaml.safe_load(get(d, "ConfigMap", "fgpu-scheduler-config")["data"]["config.yaml"])
check(cfg["extenders"][0]["urlPrefix"] == "http://127.0.0.1:8888" and cfg["profiles"][0]["schedulerName"] == "fgpu-scheduler",
      "the fgpu kube-scheduler calls the extender on the pod's loopback")
check(cs["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.31.0", "kube-scheduler of the cluster's version")
svc = get(d, "Service", "fgpu-extender")
check([p["name"] for p in svc["spec"]["ports"]] == ["webhook", "metrics"], "the extender Service exposes the webhook and the metrics only")
check("--metrics-address=0.0.0.0:19502" in cs["extender"]["args"]
      and {"name": "metrics", "containerPort": 19502, "protocol": "TCP"} in cs["extender"]["ports"],
      "extender /metrics on the pod's address, port metrics (legacy.metricsPort)")
check(get(render("1.31.0", "legacy.enabled=true", "legacy.grantWebhook.enabled=false"),
          "ValidatingWebhookConfiguration", "fgpu-legacy-grant") is None, "grant webhook can be turned off")
dg = d
grant = get(dg, "ValidatingWebhookConfiguration", "fgpu-legacy-grant")
check(grant is not None and grant["webhooks"][0]["rules"][0]["operations"] == ["CREATE", "UPDATE"]
      and grant["webhooks"][0]["failurePolicy"] == "Fail"
      and grant["webhooks"][0]["clientConfig"]["service"]["path"] == "/validate-pods",
      "grant webhook on by default: Pod CREATE and UPDATE at the extender's /validate-pods, fails closed")
jargs = [x for x in dg if x["kind"] == "Job"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
check("--validating-webhook=fgpu-legacy-grant" in jargs and "--mutating-webhook=fgpu-legacy-pods" in jargs,
      "certs Job sets the legacy webhooks' caBundle")
mut = get(d, "MutatingWebhookConfiguration", "fgpu-legacy-pods")
check("matchConditions" in mut["webhooks"][0], "legacy mutating webhook narrowed by matchConditions")
check(get(d, "ValidatingAdmissionPolicy", "fgpu-legacy-grant") is None, "1.31: no VAPs (no node claim in tokens)")
np = get(d, "NetworkPolicy", "fgpu-extender")
check(np["spec"]["ingress"] == [{"ports": [{"port": 9443, "protocol": "TCP"}]}, {"ports": [{"port": 19502, "protocol": "TCP"}]}],
      "extender NetworkPolicy: the webhook and metrics ports only")
np = get(d, "NetworkPolicy", "fgpu-device-plugin")
check(np["spec"]["ingress"] == [{"ports": [{"port": 9401, "protocol": "TCP"}]}], "device plugin NetworkPolicy: metrics port only")
d = render("1.32.0", "legacy.enabled=true")
vap = get(d, "ValidatingAdmissionPolicy", "fgpu-legacy-grant")
check(vap is not None and "system:serviceaccount:fgpu-system:fgpu-extender" in vap["spec"]["validations"][0]["expression"],
      "1.32 legacy: VAP keeps the grant annotation to the extender")
dp = get(d, "DaemonSet", "fgpu-device-plugin")
check("--split-count=10" in containers(dp)[0]["args"] and "--resource-name=nvidia.com/gpu" in containers(dp)[0]["args"],
      "device plugin: split count and resource name from values")
d = render("1.32.0", "legacy.enabled=true", "legacy.resourceNames.gpu=example.com/gpu")
cfg = yaml.safe_load(get(d, "ConfigMap", "fgpu-scheduler-config")["data"]["config.yaml"])
check(cfg["extenders"][0]["managedResources"][0]["name"] == "example.com/gpu"
      and "'example.com/gpu'" in get(d, "MutatingWebhookConfiguration", "fgpu-legacy-pods")["webhooks"][0]["matchConditions"][0]["expression"],
      "resource names reach the scheduler config and the webhook's matchCondition")

# --- fake GPUs
d = render("1.37.2", "fakeGpus.enabled=true")
ds = get(d, "DaemonSet", "fgpu-kubelet-plugin")
c = containers(ds)[0]
check("kubelet-plugin-fake" in c["image"] and "--backend=fake" in c["args"], "fake mode: the fake image and backend")
check(c["securityContext"]["privileged"] is False and c["securityContext"]["capabilities"]["drop"] == ["ALL"],
      "fake mode: no privilege, no capability")
check(get(d, "ConfigMap", "fgpu-fake-gpus") is not None, "fake profile ConfigMap")
check(c["securityContext"]["capabilities"].get("add") == ["SYS_PTRACE"],
      "fake mode, monitor report (default): only SYS_PTRACE (the fake NVML's host view), no KILL")

# --- the node monitor
for name in ("fgpu-kubelet-plugin", "fgpu-device-plugin"):
    d = render("1.37.2", "fakeGpus.enabled=true", "legacy.enabled=true", "kubeletPlugin.monitor.overQuota=kill")
    ds = get(d, "DaemonSet", name)
    c = containers(ds)[0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    check(ds["spec"]["template"]["spec"].get("hostPID") is True
          and "--over-quota=kill" in c["args"] and "--monitor-period-ms=1000" in c["args"]
          and any(a.startswith("--fake-nvml-library=") for a in c["args"])
          and env.get("FAKE_CUDA_NVML_HOST") == "1"
          and env.get("FAKE_CUDA_STATE") == "/run/fgpu-e2e/fake-state/gpu"
          and "--fake-state-dir=/run/fgpu-e2e/fake-state" in c["args"]
          and any(m["name"] == "fake-state" and m["mountPath"] == "/run/fgpu-e2e/fake-state" for m in c["volumeMounts"])
          and env.get("FAKE_CUDA_UUIDS") == "GPU-e2e00000-0000-4000-8000-000000000000,GPU-e2e00000-0000-4000-8000-000000000001"
          and c["securityContext"]["capabilities"].get("add") == ["SYS_PTRACE", "KILL"],
          f"{name}: monitor on: hostPID, flags, the fake NVML's host view and shared state, KILL for --over-quota=kill")
    d = render("1.37.2", "legacy.enabled=true", "kubeletPlugin.monitor.enabled=false")
    ds = get(d, "DaemonSet", name)
    check("hostPID" not in ds["spec"]["template"]["spec"] and "--monitor-period-ms=0" in containers(ds)[0]["args"],
          f"{name}: monitor off: no hostPID, --monitor-period-ms=0")
# --- GPU health: the same checks in both plugins, taint effects in the kubelet plugin's
d = render("1.37.2", "legacy.enabled=true", "kubeletPlugin.health.seconds=5", "kubeletPlugin.health.ignoreXids=none",
           "kubeletPlugin.health.taintFatal=NoSchedule")
for name in ("fgpu-kubelet-plugin", "fgpu-device-plugin"):
    a = containers(get(d, "DaemonSet", name))[0]["args"]
    check("--health-seconds=5" in a and "--health-recovery-checks=3" in a and "--health-ignore-xids=none" in a
          and "--health-fatal-xids=48,62,64,74,79,95,119,120" in a, f"{name}: health flags from kubeletPlugin.health")
a = containers(get(d, "DaemonSet", "fgpu-kubelet-plugin"))[0]["args"]
check("--taint-degraded=NoSchedule" in a and "--taint-fatal=NoSchedule" in a, "kubelet plugin: taint effects")
check(not any(x.startswith("--taint-") for x in containers(get(d, "DaemonSet", "fgpu-device-plugin"))[0]["args"]),
      "device plugin: no taint flags (it has no slices)")

d = render("1.37.2", "legacy.enabled=true")
for role in ("fgpu-kubelet-plugin", "fgpu-device-plugin"):
    rules = get(d, "ClusterRole", role)["rules"]
    check({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]} in rules,
          f"{role}: may create events.k8s.io Events (the monitor's, on pods)")

d = render("1.37.2", values=CHART + "/examples/demo.yaml")
ds = get(d, "DaemonSet", "fgpu-kubelet-plugin")
check("nodeSelector" not in ds["spec"]["template"]["spec"], "demo values: the plugin runs on the harness's unlabelled node")
check(containers(ds)[0]["image"] == "fgpu.local/kubelet-plugin-fake:dev", "demo values: the harness's fake image")

# --- driver name
d = render("1.37.2", "driverName=gpu.example.com", "mode=controller")
check(get(d, "DeviceClass", "shared.gpu.example.com") is not None, "classes follow driverName")
rules = get(d, "ClusterRole", "fgpu-controller")["rules"]
check(any(r.get("resourceNames") == ["shared.gpu.example.com"] for r in rules), "controller RBAC names shared.<driverName>")
check(any("devicetaintrules" in r["resources"] and {"list", "watch"} <= set(r["verbs"])
          and "create" not in r["verbs"] for r in rules),
      "controller RBAC: list/watch DeviceTaintRules (read only)")

# --- cert-manager
d = render("1.37.2", "certs.mode=certManager", "mode=controller")
check(get(d, "Certificate", "fgpu-webhook") is not None and get(d, "Job", "fgpu-certs-1") is None, "cert-manager: a Certificate, no Job")
check(get(d, "MutatingWebhookConfiguration", "fgpu-allocation-gate")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
      == "fgpu-system/fgpu-webhook-tls", "cert-manager injects the caBundle")

# --- monitoring (deploy/monitoring/, docs/observability.md)
MON_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
d = render("1.37.2")
check(not [x for x in d if x["kind"] in MON_KINDS] and get(d, "ConfigMap", "fgpu-grafana-dashboard") is None,
      "monitoring off by default: no ServiceMonitor, PodMonitor, PrometheusRule or dashboard ConfigMap")
on = ("monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true",
      "monitoring.labels.release=kube-prometheus-stack")
d = render("1.37.2", *on)
deploy = os.path.dirname(os.path.dirname(os.path.abspath(CHART)))
static = {k: [x for x in yaml.safe_load_all(open(os.path.join(deploy, "monitoring", f))) if x][0]
          for k, f in (("ServiceMonitor", "servicemonitor.yaml"), ("PodMonitor", "podmonitor.yaml"))}
svc = get(d, "Service", "fgpu-controller")
sm = get(d, "ServiceMonitor", "fgpu-controller")
sel = sm["spec"]["selector"]["matchLabels"]
check(sel.items() <= svc["metadata"]["labels"].items() and "metrics" in [p["name"] for p in svc["spec"]["ports"]]
      and sm["spec"]["namespaceSelector"]["matchNames"] == ["fgpu-system"],
      "ServiceMonitor selects the controller's Service (its labels, port metrics, the release namespace)")
ds = get(d, "DaemonSet", "fgpu-kubelet-plugin")
pm = get(d, "PodMonitor", "fgpu-kubelet-plugin")
sel = pm["spec"]["selector"]["matchLabels"]
check(sel.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
      and "metrics" in [p["name"] for p in containers(ds)[0]["ports"]],
      "PodMonitor selects the kubelet plugin's pods, port metrics")
check(get(d, "PodMonitor", "fgpu-device-plugin") is None, "no device-plugin PodMonitor without legacy.enabled")
dl = render("1.37.2", *on, "legacy.enabled=true", "legacy.devicePlugin.metricsPort=9411")
dp = get(dl, "DaemonSet", "fgpu-device-plugin")
dpm = get(dl, "PodMonitor", "fgpu-device-plugin")
check(dpm["spec"]["selector"]["matchLabels"].items() <= dp["spec"]["template"]["metadata"]["labels"].items()
      and {"name": "metrics", "containerPort": 9411, "protocol": "TCP"} in containers(dp)[0]["ports"]
      and "--metrics-address=0.0.0.0:9411" in containers(dp)[0]["args"]
      and dpm["spec"]["podMetricsEndpoints"] == get(dl, "PodMonitor", "fgpu-kubelet-plugin")["spec"]["podMetricsEndpoints"],
      "legacy: PodMonitor selects the device plugin's pods, port metrics (legacy.devicePlugin.metricsPort), same endpoint as the plugin's")
check(get(d, "ServiceMonitor", "fgpu-extender") is None, "no extender ServiceMonitor without legacy.enabled")
dl = render("1.37.2", *on, "legacy.enabled=true", "legacy.metricsPort=19512")
esvc = get(dl, "Service", "fgpu-extender")
esm = get(dl, "ServiceMonitor", "fgpu-extender")
ecs = {c["name"]: c for c in containers(get(dl, "Deployment", "fgpu-extender"))}
check(esm["spec"]["selector"]["matchLabels"].items() <= esvc["metadata"]["labels"].items()
      and {"name": "metrics", "port": 19512, "targetPort": "metrics"} in esvc["spec"]["ports"]
      and "--metrics-address=0.0.0.0:19512" in ecs["extender"]["args"]
      and esm["spec"]["endpoints"][0]["port"] == "metrics" and esm["spec"]["namespaceSelector"]["matchNames"] == ["fgpu-system"],
      "legacy: ServiceMonitor selects the extender's Service, port metrics (legacy.metricsPort)")
for kind, key, m in (("ServiceMonitor", "endpoints", sm), ("PodMonitor", "podMetricsEndpoints", pm)):
    ep = dict(m["spec"][key][0])
    check(ep.pop("scrapeTimeout") == "10s" and ep == static[kind]["spec"][key][0],
          f"{kind}: the same endpoint as deploy/monitoring's (honorLabels, relabelings, interval) + scrapeTimeout")
    check(m["metadata"]["labels"].get("release") == "kube-prometheus-stack", f"{kind}: monitoring.labels added")
rule = get(d, "PrometheusRule", "fgpu")
check(rule["spec"] == yaml.safe_load(open(os.path.join(CHART, "files/monitoring/prometheus-rules.rules.yaml"))),
      "PrometheusRule spec is files/monitoring/prometheus-rules.rules.yaml, unchanged")
cm = get(d, "ConfigMap", "fgpu-grafana-dashboard")
check(cm["metadata"]["labels"].get("grafana_dashboard") == "1" and cm["metadata"]["namespace"] == "fgpu-system"
      and json.loads(cm["data"]["fgpu-shared-gpus.json"]) == json.load(open(os.path.join(CHART, "files/monitoring/grafana-dashboard.json"))),
      "dashboard ConfigMap: the sidecar's label, the dashboard JSON unchanged")
d = render("1.37.2", *on, "monitoring.dashboard.namespace=grafana", "monitoring.dashboard.annotations.grafana_folder=GPUs",
           "kubeletPlugin.enabled=false")
cm = get(d, "ConfigMap", "fgpu-grafana-dashboard")
check(cm["metadata"]["namespace"] == "grafana" and cm["metadata"]["annotations"] == {"grafana_folder": "GPUs"},
      "dashboard ConfigMap in monitoring.dashboard.namespace, with its annotations")
check(get(d, "PodMonitor", "fgpu-kubelet-plugin") is None and get(d, "ServiceMonitor", "fgpu-controller") is not None,
      "no PodMonitor without the kubelet plugin")
d = render("1.37.2", *on, "controller.enabled=false")
check(get(d, "ServiceMonitor", "fgpu-controller") is None and get(d, "PodMonitor", "fgpu-kubelet-plugin") is not None,
      "no ServiceMonitor without the controller")

# --- the usage-aware term: the plugins keep steady claims' samples fresh only when it is on
def plugin_args(docs):
    return containers(get(docs, "DaemonSet", "fgpu-kubelet-plugin"))[0]["args"]


off = [a for a in plugin_args(render("1.37.2")) if a.startswith("--claim-status-refresh")]
check(off == [], "usage-aware term off: the plugins do not refresh unchanged claim status")
d = render("1.37.2", "controller.usageAwareWeight=1", "controller.usageFreshSeconds=300")
check("--usage-aware-weight=1" in containers(get(d, "Deployment", "fgpu-controller"))[0]["args"]
      and "--claim-status-refresh-seconds=150" in plugin_args(d),
      "usage-aware term on: the plugins refresh claim status at half the controller's freshness")

# --- GPU modes: the flags only when set
check(not any(a.startswith(("--gpu-mode", "--mig-fixed-layout")) for a in plugin_args(render("1.37.2"))),
      "GPU modes unset: no --gpu-mode, no --mig-fixed-layout")
a = plugin_args(render("1.37.2", "kubeletPlugin.gpuMode=mig", "kubeletPlugin.migFixedLayout=1g.10gb*7"))
check("--gpu-mode=mig" in a and "--mig-fixed-layout=1g.10gb*7" in a, "GPU modes: gpuMode and migFixedLayout passed")

# --- the schema refuses
for s, why in (("mode=bogus", "mode"), ("driverName=Bad_Name", "driverName"), ("certs.mode=openssl", "certs.mode"),
               ("legacy.splitCount=0", "splitCount"), ("image.pullPolicy=Sometimes", "pullPolicy"),
               ("controller.replica=2", "an unknown key"),
               ("kubeletPlugin.monitor.overQuota=bogus", "overQuota"),
               ("kubeletPlugin.monitor.periodMs=10", "periodMs"),
               ("kubeletPlugin.health.taintFatal=Evict", "a taint effect"),
               ("kubeletPlugin.health.fatalXids=79;48", "an XID list"),
               ("kubeletPlugin.gpuMode=partitioned", "a GPU mode"),
               ("monitoring.serviceMonitor.interval=often", "a scrape interval that is no duration"),
               ("monitoring.dashboard.enable=true", "an unknown monitoring key")):
    p = render("1.37.2", s, ok=False)
    check(p.returncode != 0 and "values don't meet the specifications of the schema" in p.stderr, f"schema refuses {why} ({s})")

print(f"{passed} passed, 0 failed")
