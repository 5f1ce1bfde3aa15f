use super::*;
use crate::selector::{Attr, DeviceInfo, Quantity};
use fgpu_api::dra::claim::ResourceClaim;
use fgpu_api::dra::tolerant;
use std::collections::BTreeMap;
use std::sync::Arc;

const DRIVER: &str = "gpu.fgpu.dev";
const GIB: u64 = 1 << 30;
const UUID_A: &str = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448";

fn cfg() -> HamiConfig {
    HamiConfig::new(DriverName::new(DRIVER).unwrap())
}

/// Capacity mode: kube-scheduler allocates.
fn capacity_cfg() -> HamiConfig {
    let mut c = cfg();
    c.gate = None;
    c.capacity = true;
    c
}

fn pod(annotations: Value, containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gpu-pod", "namespace": "team", "annotations": annotations},
        "spec": {"containers": containers}})
}

fn ctr(name: &str, limits: Value) -> Value {
    json!({"name": name, "image": "ubuntu:18.04", "command": ["bash", "-c", "sleep 86400"],
        "resources": {"limits": limits}})
}

fn translated(p: &Value, sizes: &[u64]) -> Translation {
    translated_with(&cfg(), p, sizes)
}

fn translated_with(c: &HamiConfig, p: &Value, sizes: &[u64]) -> Translation {
    translate(p, "team", c, sizes)
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("a GPU pod")
}

fn refused(p: &Value, sizes: &[u64]) -> String {
    translate(p, "team", &cfg(), sizes).unwrap_err().to_string()
}

/// The pod after the patch.
fn patched(p: &Value, t: &Translation) -> Value {
    let ops: json_patch::Patch = serde_json::from_value(Value::Array(t.patch.clone())).unwrap();
    let mut out = p.clone();
    json_patch::patch(&mut out, &ops).unwrap_or_else(|e| panic!("{e}: {:#}", json!(t.patch)));
    out
}

/// The template's devices.
fn devices(t: &Translation) -> &Value {
    &t.template["spec"]["spec"]["devices"]
}

/// An H100 as the kubelet plugin publishes it, for the selectors.
fn h100(uuid: &str, memory: &str) -> DeviceInfo {
    let s = |v: &str| Attr::Str(Arc::from(v));
    DeviceInfo {
        attributes: vec![
            (Arc::from("productName"), s("NVIDIA H100 80GB HBM3")),
            (Arc::from("uuid"), s(uuid)),
            (Arc::from("type"), s("gpu")),
            (Arc::from("numaNode"), Attr::Int(0)),
        ],
        capacity: vec![
            (Arc::from("memory"), Quantity::parse(memory).unwrap()),
            (Arc::from("cores"), Quantity::parse("100").unwrap()),
        ],
        multi: true,
    }
}

/// The template read back as the controller reads a claim made from it.
fn as_claim(
    t: &Translation,
    annotations: &BTreeMap<String, String>,
) -> Vec<crate::request::PendingClaim> {
    let claim: ResourceClaim = tolerant::from_value(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "gpu-pod-fgpu-hami-x", "namespace": "team", "uid": "u1"},
        "spec": t.template["spec"]["spec"],
    }));
    crate::request::requests_in_class(
        &claim,
        None,
        annotations,
        "team/gpu-pod",
        &DriverName::new(DRIVER).unwrap(),
        Policy::BINPACK,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// HAMi's README example: one GPU, 3000 MiB, 30 % of the cores.
#[test]
fn the_readme_pod_becomes_a_share_of_3000_mib_and_30_cores() {
    let p = pod(
        json!({}),
        json!([ctr(
            "ubuntu-container",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30", "cpu": "1"})
        )]),
    );
    let t = translated(&p, &[]);
    let name = t.template_name().to_owned();
    assert!(name.starts_with("hami-") && name.len() == 17, "{name}");
    assert_eq!(
        t.template,
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "team",
                "labels": {"app.kubernetes.io/managed-by": "fgpu-controller"}},
            "spec": {"spec": {"devices": {
                "requests": [{"name": "ubuntu-container", "exactly": {
                    "deviceClassName": "shared.gpu.fgpu.dev", "allocationMode": "ExactCount", "count": 1}}],
                "config": [{"requests": ["ubuntu-container"], "opaque": {"driver": DRIVER, "parameters": {
                    "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": "3000Mi", "cores": 30}}}]
            }}}
        })
    );
    let out = patched(&p, &t);
    assert_eq!(
        out["spec"]["containers"][0]["resources"],
        json!({"limits": {"cpu": "1"}, "claims": [{"name": "fgpu-hami", "request": "ubuntu-container"}]})
    );
    assert_eq!(
        out["spec"]["resourceClaims"],
        json!([{"name": "fgpu-hami", "resourceClaimTemplateName": name}])
    );
    assert_eq!(
        out["spec"]["schedulingGates"],
        json!([{"name": "gpu.fgpu.dev/allocate"}])
    );
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    // The controller reads the template as it reads a user's: 3000 MiB, 30 cores, 1 GPU.
    let read = as_claim(&t, &BTreeMap::new());
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].request.gpus, 1);
    assert_eq!(
        read[0].request.share,
        GpuShare::Memory { bytes: 3000 << 20 }
    );
    assert_eq!(read[0].request.cores, Some(30));
    // In capacity mode the quota is also in capacity (what kube-scheduler reads), and the
    // controller reads the same from it.
    let c = translated_with(&capacity_cfg(), &p, &[]);
    assert_eq!(
        devices(&c)["requests"][0]["exactly"]["capacity"],
        json!({"requests": {"memory": "3000Mi", "cores": "30"}})
    );
    assert_ne!(c.template_name(), name);
    assert!(patched(&p, &c)["spec"].get("schedulingGates").is_none());
    let read = as_claim(&c, &BTreeMap::new());
    assert_eq!(
        read[0].request.share,
        GpuShare::Memory { bytes: 3000 << 20 }
    );
    assert_eq!(read[0].request.cores, Some(30));
    // And the claim webhook admits it without a warning.
    assert_eq!(
        crate::admission::validate(
            &t.template,
            "ResourceClaimTemplate",
            &DriverName::new(DRIVER).unwrap(),
            &crate::admission::ClassPolicy::new()
        ),
        Ok(vec![])
    );
}

/// HAMi's documented examples (README, examples/nvidia/*.yaml): what each container's
/// request asks for.
#[test]
fn hami_examples_table() {
    /// (case, limits, gpus, memory request, cores request)
    type Case = (
        &'static str,
        Value,
        u64,
        Option<&'static str>,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "default_use: gpu, gpumem, gpucores",
            json!({"nvidia.com/gpu": 2, "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
            2,
            Some("3000Mi"),
            Some("30"),
        ),
        (
            "use_exclusive_card: gpu alone",
            json!({"nvidia.com/gpu": "2"}),
            2,
            None,
            None,
        ),
        (
            "gpumem alone: one GPU",
            json!({"nvidia.com/gpumem": "10240"}),
            1,
            Some("10Gi"),
            None,
        ),
        (
            "gpucores alone: whole memory, its cores",
            json!({"nvidia.com/gpucores": "20"}),
            1,
            None,
            Some("20"),
        ),
        (
            "gpumem-percentage 100: whole memory",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}),
            1,
            None,
            None,
        ),
    ];
    for (case, limits, gpus, memory, cores) in cases {
        let t = translated_with(
            &capacity_cfg(),
            &pod(json!({}), json!([ctr("c", limits)])),
            &[],
        );
        let e = &devices(&t)["requests"][0]["exactly"];
        assert_eq!(e["count"], gpus, "{case}");
        assert_eq!(
            e["capacity"]["requests"]["memory"].as_str(),
            memory,
            "{case}"
        );
        assert_eq!(e["capacity"]["requests"]["cores"].as_str(), cores, "{case}");
    }
}

/// `gpumem-percentage: 50` on a cluster of 80 GiB and 40 GiB GPUs: one alternative per
/// size, each asking half of it; the controller reads both alternatives.
#[test]
fn a_percentage_becomes_one_alternative_per_gpu_size() {
    let p = pod(
        json!({}),
        json!([ctr(
            "c",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"})
        )]),
    );
    let review = json!({"request": {"object": p}});
    let names = LegacyResourceNames::default();
    assert!(needs_gpu_sizes(&review, &names));
    let whole = pod(
        json!({}),
        json!([ctr("c", json!({"nvidia.com/gpumem-percentage": 100}))]),
    );
    assert!(!needs_gpu_sizes(
        &json!({"request": {"object": whole}}),
        &names
    ));
    let number = pod(
        json!({}),
        json!([ctr("c", json!({"nvidia.com/gpumem-percentage": 50}))]),
    );
    assert!(needs_gpu_sizes(
        &json!({"request": {"object": number}}),
        &names
    ));
    let t = translated_with(&capacity_cfg(), &p, &[80 * GIB, 40 * GIB, 80 * GIB, 0]);
    let r = &devices(&t)["requests"][0];
    assert_eq!(r["name"], "c");
    let subs = r["firstAvailable"].as_array().unwrap();
    assert_eq!(subs.len(), 2, "{r:#}");
    assert_eq!(subs[0]["name"], "mem-40960mi");
    assert_eq!(subs[0]["capacity"]["requests"]["memory"], "20Gi");
    assert_eq!(subs[1]["name"], "mem-81920mi");
    assert_eq!(subs[1]["capacity"]["requests"]["memory"], "40Gi");
    assert_eq!(
        devices(&t)["config"][1]["requests"],
        json!(["c/mem-81920mi"])
    );
    let read = as_claim(&t, &BTreeMap::new());
    assert_eq!(read.len(), 2);
    assert_eq!(read[1].request_name, "c/mem-81920mi");
    assert_eq!(read[1].request.share, GpuShare::Memory { bytes: 40 * GIB });
    // Each alternative selects its size only.
    let sel = &read[1].selectors[0].compiled;
    assert_eq!(sel.matches(DRIVER, &h100(UUID_A, "80Gi")), Ok(true));
    assert_eq!(sel.matches(DRIVER, &h100(UUID_A, "40Gi")), Ok(false));
    // 33 % of 81559 MiB, in whole MiB.
    assert_eq!(percent_of(81559 << 20, 33), 26914 << 20);
}

#[test]
fn gpu_model_and_uuid_annotations_become_selectors() {
    let p = pod(
        json!({
            "nvidia.com/use-gputype": "A100, H100",
            "nvidia.com/nouse-gputype": "PCIe",
            "nvidia.com/use-gpuuuid": format!("{UUID_A},GPU-b"),
            "nvidia.com/nouse-gpuuuid": "GPU-b",
            "hami.io/node-scheduler-policy": "spread",
            "hami.io/gpu-scheduler-policy": "binpack",
        }),
        json!([ctr(
            "c",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"})
        )]),
    );
    let t = translated(&p, &[]);
    let sels: Vec<&str> = devices(&t)["requests"][0]["exactly"]["selectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["cel"]["expression"].as_str().unwrap())
        .collect();
    assert_eq!(
        sels,
        [
            r#"device.attributes["gpu.fgpu.dev"].productName.lowerAscii().contains("a100") || device.attributes["gpu.fgpu.dev"].productName.lowerAscii().contains("h100")"#,
            r#"!(device.attributes["gpu.fgpu.dev"].productName.lowerAscii().contains("pcie"))"#,
            r#"device.attributes["gpu.fgpu.dev"].uuid in ["GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", "GPU-b"]"#,
            r#"!(device.attributes["gpu.fgpu.dev"].uuid in ["GPU-b"])"#,
        ]
    );
    // The policy annotations stay on the pod: the controller reads them there.
    let out = patched(&p, &t);
    assert_eq!(out["metadata"], p["metadata"]);
    let ann: BTreeMap<String, String> =
        serde_json::from_value(p["metadata"]["annotations"].clone()).unwrap();
    let read = as_claim(&t, &ann);
    assert_eq!(read[0].policy.node, NodePolicy::Spread);
    assert_eq!(read[0].policy.gpu, GpuPolicy::Binpack);
    let all = |uuid: &str| {
        read[0]
            .selectors
            .iter()
            .map(|s| s.compiled.matches(DRIVER, &h100(uuid, "80Gi")))
            .collect::<Result<Vec<bool>, _>>()
            .map(|v| v.into_iter().all(|b| b))
    };
    assert_eq!(all(UUID_A), Ok(true));
    assert_eq!(all("GPU-b"), Ok(false), "excluded by nouse-gpuuuid");
    assert_eq!(all("GPU-c"), Ok(false), "not in use-gpuuuid");
}

/// A quote in an annotation stays inside the CEL string.
#[test]
fn annotation_text_cannot_leave_the_cel_string() {
    let p = pod(
        json!({"nvidia.com/use-gputype": r#"x") || true || ("#}),
        json!([ctr("c", json!({"nvidia.com/gpu": "1"}))]),
    );
    let t = translated(&p, &[]);
    let e = devices(&t)["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
        .as_str()
        .unwrap();
    let compiled = crate::selector::compile(e).unwrap();
    assert_eq!(
        compiled.matches(DRIVER, &h100(UUID_A, "80Gi")),
        Ok(false),
        "{e}"
    );
}

#[test]
fn numa_bind_constrains_a_multi_gpu_request() {
    let p = pod(
        json!({"nvidia.com/numa-bind": "true"}),
        json!([
            ctr("two", json!({"nvidia.com/gpu": "2"})),
            ctr("one", json!({"nvidia.com/gpu": "1"}))
        ]),
    );
    let t = translated(&p, &[]);
    assert_eq!(
        devices(&t)["constraints"],
        json!([{"requests": ["two"], "matchAttribute": "gpu.fgpu.dev/numaNode"}])
    );
    let out = patched(&p, &t);
    assert_eq!(
        out["spec"]["containers"][1]["resources"]["claims"],
        json!([{"name": "fgpu-hami", "request": "one"}])
    );
}

#[test]
fn priority_zero_asks_high_and_one_is_the_default() {
    let t = translated(
        &pod(
            json!({}),
            json!([
                ctr(
                    "hi",
                    json!({"nvidia.com/gpumem": "1000", "nvidia.com/priority": "0"})
                ),
                ctr(
                    "lo",
                    json!({"nvidia.com/gpumem": "1000", "nvidia.com/priority": "1"})
                )
            ]),
        ),
        &[],
    );
    let config = devices(&t)["config"].as_array().unwrap();
    assert_eq!(config[0]["opaque"]["parameters"]["priority"], "high");
    assert!(config[1]["opaque"]["parameters"].get("priority").is_none());
}

/// Containers without GPUs keep their resources; other claims of the pod stay; a pod
/// with no GPU is not translated.
#[test]
fn only_gpu_containers_change() {
    let mut p = pod(
        json!({}),
        json!([
            ctr("side", json!({"cpu": "1"})),
            {"name": "gpu", "image": "x", "resources": {
                "limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1", "memory": "1Gi"},
                "claims": [{"name": "other"}]}}
        ]),
    );
    p["spec"]["resourceClaims"] = json!([{"name": "other", "resourceClaimName": "x"}]);
    let t = translated(&p, &[]);
    let out = patched(&p, &t);
    assert_eq!(out["spec"]["containers"][0], p["spec"]["containers"][0]);
    assert_eq!(
        out["spec"]["containers"][1]["resources"],
        json!({"limits": {}, "requests": {"memory": "1Gi"},
            "claims": [{"name": "other"}, {"name": "fgpu-hami", "request": "gpu"}]})
    );
    assert_eq!(out["spec"]["resourceClaims"][0]["name"], "other");
    assert_eq!(out["spec"]["resourceClaims"][1]["name"], "fgpu-hami");
    let none = pod(json!({}), json!([ctr("c", json!({"cpu": "1"}))]));
    assert_eq!(translate(&none, "team", &cfg(), &[]), Ok(None));
    // Another device plugin's `nvidia.com/` resource alone is not ours to refuse.
    let mig = pod(
        json!({}),
        json!([ctr("c", json!({"nvidia.com/mig-1g.10gb": "1"}))]),
    );
    assert_eq!(translate(&mig, "team", &cfg(), &[]), Ok(None));
}

/// Where kube-scheduler allocates (no gate): no gate in the patch, and a warning for each
/// policy annotation.
#[test]
fn capacity_mode_adds_no_gate_and_warns_of_policies() {
    let c = capacity_cfg();
    let p = pod(
        json!({"hami.io/node-scheduler-policy": "binpack", "nvidia.com/vgpu-mode": "mig"}),
        json!([ctr("c", json!({"nvidia.com/gpu": "1"}))]),
    );
    let t = translate(&p, "team", &c, &[]).unwrap().unwrap();
    assert!(patched(&p, &t)["spec"].get("schedulingGates").is_none());
    assert_eq!(t.warnings.len(), 2, "{:?}", t.warnings);
    assert!(
        t.warnings[0].contains("hami.io/node-scheduler-policy"),
        "{:?}",
        t.warnings
    );
    assert!(
        t.warnings[1].contains("nvidia.com/vgpu-mode"),
        "{:?}",
        t.warnings
    );
}

#[test]
fn v1beta1_templates_have_the_fields_in_the_request() {
    let mut c = capacity_cfg();
    c.api = ApiVersion::V1beta1;
    let p = pod(
        json!({}),
        json!([ctr("c", json!({"nvidia.com/gpumem": "1000"}))]),
    );
    let t = translate(&p, "team", &c, &[]).unwrap().unwrap();
    assert_eq!(t.template["apiVersion"], "resource.k8s.io/v1beta1");
    let r = &devices(&t)["requests"][0];
    assert!(r.get("exactly").is_none(), "{r}");
    assert_eq!(r["deviceClassName"], "shared.gpu.fgpu.dev");
    assert_eq!(r["capacity"]["requests"]["memory"], "1000Mi");
}

/// Every refusal names the pod, the field and, for a container's field, the container;
/// nothing is translated half.
#[test]
fn refusals_table() {
    let one = |limits: Value| pod(json!({}), json!([ctr("main", limits)]));
    let mut claimed = one(json!({"nvidia.com/gpu": "1"}));
    claimed["spec"]["resourceClaims"] = json!([{"name": "a", "resourceClaimName": "a"}, {"name": "fgpu-hami", "resourceClaimName": "b"}]);
    let mut ctr_claimed = one(json!({"nvidia.com/gpu": "1"}));
    ctr_claimed["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "fgpu-hami"}]);
    let mut init = one(json!({"cpu": "1"}));
    init["spec"]["initContainers"] = json!([ctr("init", json!({"nvidia.com/gpu": "1"}))]);
    let many: Vec<u64> = (1..=9).map(|g| g * GIB).collect();
    let pct = one(json!({"nvidia.com/gpumem-percentage": "50"}));
    let cases: Vec<(&str, Value, &[u64], &str)> = vec![
        (
            "unknown resource",
            one(json!({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"})),
            &[],
            "pod team/gpu-pod: spec.containers[0].resources.limits[\"nvidia.com/mig-1g.10gb\"]: container \"main\": not a resource the DRA translation knows",
        ),
        (
            "percentage above 100",
            one(json!({"nvidia.com/gpumem-percentage": "150"})),
            &[],
            "pod team/gpu-pod: spec.containers[0].resources.limits[\"nvidia.com/gpumem-percentage\"]: 150 is above the maximum 100",
        ),
        (
            "memory and percentage",
            one(json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "50"})),
            &[],
            "pod team/gpu-pod: spec.containers[0].resources.limits[\"nvidia.com/gpumem-percentage\"]: container \"main\": given beside nvidia.com/gpumem",
        ),
        (
            "claim name taken",
            claimed,
            &[],
            "pod team/gpu-pod: spec.resourceClaims[1].name: \"fgpu-hami\" is the name",
        ),
        (
            "container claim name taken",
            ctr_claimed,
            &[],
            "pod team/gpu-pod: spec.containers[0].resources.claims[0].name: container \"main\": \"fgpu-hami\"",
        ),
        (
            "init container",
            init,
            &[],
            "pod team/gpu-pod: spec.initContainers[0].resources: init container \"init\" asks for GPUs",
        ),
        (
            "percentage without published GPUs",
            pct.clone(),
            &[],
            "container \"main\": 50 % of a GPU, but no GPU of gpu.fgpu.dev is published",
        ),
        (
            "percentage over nine sizes",
            pct,
            &many,
            "the cluster's GPUs come in 9 memory sizes and a request may list at most 8",
        ),
        (
            "priority",
            one(json!({"nvidia.com/gpu": "1", "nvidia.com/priority": "2"})),
            &[],
            "pod team/gpu-pod: spec.containers[0].resources.limits[\"nvidia.com/priority\"]: container \"main\": \"2\"; valid are 0 (high) and 1",
        ),
        (
            "policy annotation",
            pod(
                json!({"hami.io/gpu-scheduler-policy": "mutex"}),
                json!([ctr("main", json!({"nvidia.com/gpu": "1"}))]),
            ),
            &[],
            "pod team/gpu-pod: metadata.annotations[\"hami.io/gpu-scheduler-policy\"]: \"mutex\"",
        ),
        (
            "node preset",
            {
                let mut p = one(json!({"nvidia.com/gpu": "1"}));
                p["spec"]["nodeName"] = json!("node-a");
                p
            },
            &[],
            "pod team/gpu-pod: spec.nodeName: preset;",
        ),
        (
            "not a whole number",
            one(json!({"nvidia.com/gpucores": "1.5"})),
            &[],
            "pod team/gpu-pod: spec.containers[0].resources.limits[\"nvidia.com/gpucores\"]:",
        ),
    ];
    for (case, p, sizes, want) in cases {
        let m = refused(&p, sizes);
        assert!(m.contains(want), "{case}: {m}");
    }
}

#[test]
fn the_name_is_stable_and_follows_the_content() {
    let spec = json!({"spec": {"devices": {"requests": [{"name": "c"}]}}});
    // Fixed: a change of the hash would orphan every template made before it. (FNV-1a 64
    // of `resource.k8s.io/v1\0{"spec":...}`, computed apart from this code.)
    assert_eq!(
        template_name("resource.k8s.io/v1", &spec),
        "hami-aca2dcd25691"
    );
    assert_ne!(
        template_name("resource.k8s.io/v1beta2", &spec),
        template_name("resource.k8s.io/v1", &spec)
    );
    let other = json!({"spec": {"devices": {"requests": [{"name": "d"}]}}});
    assert_ne!(
        template_name("resource.k8s.io/v1", &other),
        template_name("resource.k8s.io/v1", &spec)
    );
    // Identical pods in other pods' names meet one template; other quotas do not.
    let a = translated(
        &pod(
            json!({}),
            json!([ctr("c", json!({"nvidia.com/gpumem": "1000"}))]),
        ),
        &[],
    );
    let mut p = pod(
        json!({}),
        json!([ctr("c", json!({"nvidia.com/gpumem": "1000"}))]),
    );
    p["metadata"]["name"] = json!("another");
    assert_eq!(translated(&p, &[]).template_name(), a.template_name());
    let c = translated(
        &pod(
            json!({}),
            json!([ctr("c", json!({"nvidia.com/gpumem": "1001"}))]),
        ),
        &[],
    );
    assert_ne!(c.template_name(), a.template_name());
}

fn review_of(operation: &str, p: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "r1", "operation": operation, "namespace": "team",
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": p}})
}

#[test]
fn reviews_create_admit_or_refuse() {
    let gpu = pod(json!({}), json!([ctr("c", json!({"nvidia.com/gpu": "1"}))]));
    match review(&review_of("CREATE", gpu.clone()), &cfg(), &[]) {
        Reviewed::Create {
            namespace,
            translation,
            answer,
        } => {
            assert_eq!(namespace, "team");
            assert_eq!(answer["response"]["allowed"], true);
            assert_eq!(answer["response"]["patchType"], "JSONPatch");
            assert_eq!(translation.template["metadata"]["namespace"], "team");
        }
        other => panic!("{other:?}"),
    }
    let mut dry = review_of("CREATE", gpu.clone());
    dry["request"]["dryRun"] = json!(true);
    let Reviewed::Answer(a) = review(&dry, &cfg(), &[]) else {
        panic!("a dry run creates nothing");
    };
    assert_eq!(a["response"]["patchType"], "JSONPatch", "{a}");
    let Reviewed::Answer(a) = review(&review_of("UPDATE", gpu), &cfg(), &[]) else {
        panic!("an update is answered at once");
    };
    assert_eq!(a["response"]["allowed"], true);
    assert!(a["response"].get("patch").is_none());
    let bad = pod(json!({}), json!([ctr("c", json!({"nvidia.com/gpu": "x"}))]));
    let Reviewed::Answer(a) = review(&review_of("CREATE", bad), &cfg(), &[]) else {
        panic!("a refusal is answered at once");
    };
    assert_eq!(a["response"]["allowed"], false);
    assert!(
        a["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("fgpu: pod team/gpu-pod: spec.containers[0]"),
        "{a}"
    );
    let Reviewed::Answer(a) = review(&review_of("CREATE", json!("not a pod")), &cfg(), &[]) else {
        panic!("not a pod");
    };
    assert_eq!(a["response"]["allowed"], false, "{a}");
}

/// docs/controller.md's worked example, as the page shows it.
#[test]
fn the_worked_example_of_the_docs() {
    let p = pod(
        json!({"nvidia.com/use-gputype": "H100"}),
        json!([ctr(
            "ubuntu-container",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"})
        )]),
    );
    let t = translated(&p, &[]);
    assert_eq!(t.template_name(), "hami-9ef66a3aa4b4");
}

/// A template read back from the API server holds what was written when only the server's
/// defaults and canonical quantities differ; a dropped, changed or extra array element
/// field does not.
#[test]
fn a_stored_template_holds_the_written_spec_despite_defaults() {
    let written = json!({"spec": {"devices": {
        "requests": [{"name": "main", "exactly": {"deviceClassName": "shared.gpu.fgpu.dev",
            "count": 1, "capacity": {"requests": {"memory": "3072Mi", "cores": "30"}}}}],
        "config": [{"requests": ["main"], "opaque": {"driver": "gpu.fgpu.dev",
            "parameters": {"memory": "3000Mi"}}}]}}});
    let mut stored = written.clone();
    stored["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = json!("ExactCount");
    stored["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] =
        json!("3Gi");
    stored["metadata"] = json!({});
    assert!(holds_spec(&stored, &written));

    let mut changed = stored.clone();
    changed["spec"]["devices"]["requests"][0]["exactly"]["count"] = json!(2);
    assert!(!holds_spec(&changed, &written), "count changed");
    let mut dropped = stored.clone();
    dropped["spec"]["devices"]["requests"][0]["exactly"]
        .as_object_mut()
        .unwrap()
        .remove("capacity");
    assert!(!holds_spec(&dropped, &written), "capacity dropped");
    let mut more = stored.clone();
    more["spec"]["devices"]["config"]
        .as_array_mut()
        .unwrap()
        .push(json!({"requests": ["main"]}));
    assert!(!holds_spec(&more, &written), "another config entry");
    let mut other_memory = stored;
    other_memory["spec"]["devices"]["config"][0]["opaque"]["parameters"]["memory"] =
        json!("3001Mi");
    assert!(!holds_spec(&other_memory, &written), "another quota");
}
