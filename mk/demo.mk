# Temporary demo until the local-cluster harness (mk/cluster.mk) takes `make demo` over:
# shows what exists today — the fake GPU inventory as the kubelet plugin discovers it.
.PHONY: demo
demo: ## set up and run the main job (today: discover the fake GPUs)
	$(CARGO) run -q -p fgpu-kubelet-plugin -- discover --backend fake --fake-gpus deploy/fake/node-2xh100.yaml
