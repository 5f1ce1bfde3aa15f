# Local real-Kubernetes harness: upstream components built from their Go modules (cached in
# $(FGPU_CACHE)/k8s), run as processes on this machine. See docs/local-cluster.md.
#   make e2e K8S_VERSION=1.34       make cluster-up K8S_VERSION=1.32       make cluster-down
K8S_VERSION ?=
.PHONY: k8s-build cluster-up cluster-down e2e images demo

k8s-build: ## build (once, cached) kube-*, kubelet, kubectl, etcd, containerd, helm [K8S_VERSION=1.37]
	hack/k8s-build.sh $(K8S_VERSION)

images: ## build the pause and workload OCI images (_out/images)
	hack/images.sh build

cluster-up: ## start the local one-node cluster [K8S_VERSION=1.37]; then: source _out/cluster.env
	hack/cluster-up.sh $(K8S_VERSION)

cluster-down: ## stop the local cluster and remove its state (logs stay in _out/logs)
	hack/cluster-down.sh

e2e: ## bring the local cluster up, run tests/e2e scenarios, tear down [K8S_VERSION=1.37]
	hack/e2e.sh $(K8S_VERSION)

demo: ## the README's first command: build everything, start the cluster, show fgpu sharing a fake GPU
	hack/demo.sh

TEST_TARGETS += e2e
