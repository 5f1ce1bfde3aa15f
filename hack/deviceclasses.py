#!/usr/bin/env python3
"""fgpu's DeviceClasses (deploy/deviceclasses.yaml, on stdin) as one deployment wants them,
on stdout.

    hack/deviceclasses.py controller-mode < deploy/deviceclasses.yaml

controller-mode: the shared class as the Helm chart renders it in controller mode
(deploy/helm/fgpu/templates/deviceclasses.yaml): its selector asks for a device type no
device has, so kube-scheduler never allocates a shared claim itself; fgpu's controller, which
does not evaluate class selectors, allocates them alone. Used by tests/e2e/42-controller-retry
and hack/bench-replay.sh.
"""
import sys

SHIPPED = 'device.attributes["gpu.fgpu.dev"].type == "gpu"'
NO_DEVICE = 'device.attributes["gpu.fgpu.dev"].type == "allocated-by-fgpu-controller"'


def controller_mode(text: str) -> str:
    docs = text.split("\n---\n")
    found = False
    for i, d in enumerate(docs):
        if "name: shared.gpu.fgpu.dev" in d:
            if SHIPPED not in d:
                sys.exit("deviceclasses.py: the shared class has no type selector to replace")
            docs[i] = d.replace(SHIPPED, NO_DEVICE)
            found = True
    if not found:
        sys.exit("deviceclasses.py: no shared class (shared.gpu.fgpu.dev) in the input")
    return "\n---\n".join(docs)


def main() -> None:
    if sys.argv[1:] != ["controller-mode"]:
        sys.exit("usage: hack/deviceclasses.py controller-mode < deploy/deviceclasses.yaml")
    sys.stdout.write(controller_mode(sys.stdin.read()))


if __name__ == "__main__":
    main()
