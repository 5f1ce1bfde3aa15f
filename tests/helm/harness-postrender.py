#!/usr/bin/env python3
"""Helm post-renderer for the local harness only (tests/e2e/7x-helm-*, make demo).

    helm install ... --post-renderer tests/helm/harness-postrender.py \
        --post-renderer-args APISERVER_HOST --post-renderer-args APISERVER_PORT

The local cluster has no kube-proxy and no CoreDNS, so a pod cannot reach the `kubernetes`
Service and the API server cannot reach a webhook Service. The chart stays as an admin gets
it; this rewrites its output the way the other in-cluster scenarios patch their manifests
(33-dra-daemonset, 45-controller-deployment): every pod of the release on the host's network
with KUBERNETES_SERVICE_HOST/PORT set to the API server's host address, and each webhook
called by URL on 127.0.0.1 at the controller's webhook port instead of through its Service
(the certs Job adds 127.0.0.1 to the certificate: certs.extraDnsNames), and Deployments
recreated rather than surged (host ports).
"""
import sys

import yaml

HOST, PORT = sys.argv[1], sys.argv[2]
WEBHOOK_PORT = {"fgpu-controller": 9443, "fgpu-extender": 9443}


def pod_spec(doc):
    k = doc["kind"]
    if k in ("Deployment", "DaemonSet", "Job"):
        return doc["spec"]["template"]["spec"]
    if k == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


out = []
for doc in yaml.safe_load_all(sys.stdin):
    if not doc:
        continue
    spec = pod_spec(doc)
    if doc["kind"] == "Deployment":
        # on the host network a pod's ports are host ports: a surge pod could never be
        # placed beside the old one on the harness's single node
        doc["spec"]["strategy"] = {"type": "Recreate"}
    if spec is not None:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            env = [e for e in c.get("env", []) if not e["name"].startswith("KUBERNETES_SERVICE_")]
            env += [{"name": "KUBERNETES_SERVICE_HOST", "value": HOST}, {"name": "KUBERNETES_SERVICE_PORT", "value": PORT}]
            c["env"] = env
    if doc["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for w in doc.get("webhooks", []):
            svc = w["clientConfig"].pop("service")
            w["clientConfig"]["url"] = f"https://127.0.0.1:{WEBHOOK_PORT[svc['name']]}{svc['path']}"
    out.append(doc)
sys.stdout.write(yaml.safe_dump_all(out, sort_keys=False))
