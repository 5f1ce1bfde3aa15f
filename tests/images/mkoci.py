#!/usr/bin/env python3
"""Write a single-layer OCI image archive (OCI image layout in a tar) from a root directory.

    mkoci.py ROOTFS IMAGE_REF OUT.tar [--entrypoint /pause] [--cmd sh ...] [--user UID:GID] [--label K=V]

Used by hack/images.sh: no registry and no image builder are available on these machines,
so the images the local cluster needs are assembled here and imported with
`ctr -n k8s.io images import`. The layer tar is deterministic (mtime 0, uid/gid 0), so the
same inputs give the same digest.
"""
import argparse
import hashlib
import io
import json
import os
import stat
import tarfile


def layer_tar(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in [None] + sorted(filenames) + sorted(d for d in dirnames if os.path.islink(os.path.join(dirpath, d))):
                path = dirpath if name is None else os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if rel == ".":
                    continue
                info = tar.gettarinfo(path, arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
            # symlinked dirs are listed above as entries; do not descend into them
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return buf.getvalue()


def blob(tar, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
    return "sha256:" + digest, len(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rootfs")
    ap.add_argument("ref", help="full image reference, e.g. fgpu.local/pause:3.10")
    ap.add_argument("out")
    ap.add_argument("--entrypoint", nargs="*", default=None)
    ap.add_argument("--cmd", nargs="*", default=None)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--user", default=None, help="the config's User, numeric (runAsNonRoot can check it)")
    ap.add_argument("--label", action="append", default=[], help="KEY=VALUE, the config's Labels")
    a = ap.parse_args()

    layer = layer_tar(a.rootfs)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"] + a.env},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "fgpu tests/images/mkoci.py"}],
    }
    if a.entrypoint:
        config["config"]["Entrypoint"] = a.entrypoint
    if a.cmd:
        config["config"]["Cmd"] = a.cmd
    if a.user:
        config["config"]["User"] = a.user
    if a.label:
        config["config"]["Labels"] = dict(kv.split("=", 1) for kv in a.label)
    tag = a.ref.rsplit(":", 1)[1] if ":" in a.ref.rsplit("/", 1)[-1] else "latest"
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        cfg_digest, cfg_size = blob(tar, json.dumps(config, sort_keys=True).encode())
        ldig, lsize = blob(tar, layer)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest, "size": cfg_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ldig, "size": lsize}],
        }
        mdig, msize = blob(tar, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": mdig, "size": msize,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": a.ref, "org.opencontainers.image.ref.name": tag},
            }],
        }
        for name, data in (("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                           ("index.json", json.dumps(index, sort_keys=True).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, a.out)
    print(f"{a.ref} {mdig} {len(layer) // 1024} KiB -> {a.out}")


if __name__ == "__main__":
    main()
