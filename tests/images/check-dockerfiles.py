#!/usr/bin/env python3
"""Does each harness-built image hold exactly what its Dockerfile declares?

    check-dockerfiles.py ROOT IMAGES_DIR

There is no Docker engine or registry on these machines, so hack/images.sh packs the images
itself (mkoci.py). deploy/images/<name>/Dockerfile is the one definition an admin builds
from; this checks the harness's _out/images/<name>.tar against it:
  * every file the final stage COPYs is in the image, at that path (files COPYed from the
    build context byte for byte), and no other fgpu file is (under /usr/bin, /usr/local/bin,
    /usr/lib/fgpu, /usr/share/doc/fgpu, /etc/fgpu, /bin/busybox);
  * the busybox applets the Dockerfile's RUN links are the image's /bin links;
  * ENTRYPOINT, USER and the licence label are the config's;
  * a production image holds no CUDA driver, NVML or fake of either.
A stage `FROM ${PLUGIN_IMAGE}` inherits that image's declarations. `--self-test` checks that
the production node image's Dockerfile is refused against the fake image (which holds two
undeclared files), so the check can fail. Prints "N passed, M failed".
"""
import io
import json
import os
import re
import sys
import tarfile

OWNED = ("/usr/bin/", "/usr/local/bin/", "/usr/lib/fgpu/", "/usr/share/doc/fgpu/", "/etc/fgpu/")
IMAGES = {  # image archive -> (Dockerfile, parent image archive or None, production?)
    "kubelet-plugin": ("kubelet-plugin", None, True),
    "kubelet-plugin-fake": ("kubelet-plugin-fake", "kubelet-plugin", False),
    "controller": ("controller", None, True),
}


def final_stage(path):
    """COPY (src, dest, from-context), applets, entrypoint, user, labels of the last stage."""
    text = open(path).read().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    last = max(i for i, ln in enumerate(lines) if ln.upper().startswith("FROM "))
    st = {"from": lines[last].split()[1], "copies": [], "applets": [], "entrypoint": None, "user": None, "labels": {}}
    for ln in lines[last + 1:]:
        word, _, rest = ln.partition(" ")
        word = word.upper()
        if word == "COPY":
            parts = rest.split()
            ctx = not parts[0].startswith("--from=")
            parts = [p for p in parts if not p.startswith("--")]
            st["copies"].append((parts[0], parts[1], ctx))
        elif word == "RUN":
            m = re.search(r"for a in ([^;]+);", rest)
            if m:
                st["applets"] += m.group(1).split()
        elif word == "ENTRYPOINT":
            st["entrypoint"] = json.loads(rest)
        elif word == "USER":
            st["user"] = rest.strip()
        elif word == "LABEL":
            for k, v in re.findall(r'([\w.\-]+)="([^"]*)"', rest):
                st["labels"][k] = v
    return st


def declared(root, name):
    df, parent, _ = IMAGES[name]
    st = final_stage(os.path.join(root, "deploy/images", df, "Dockerfile"))
    if parent:
        base = declared(root, parent)
        base["copies"] = base["copies"] + st["copies"]
        for k in ("entrypoint", "user"):
            base[k] = st[k] or base[k]
        base["labels"].update(st["labels"])
        return base
    return st


def image(tar_path):
    with tarfile.open(tar_path) as t:
        index = json.load(t.extractfile("index.json"))
        blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":", 1)[1]).read()
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        files, links, data = {}, {}, {}
        with tarfile.open(fileobj=io.BytesIO(blob(manifest["layers"][0]["digest"]))) as layer:
            for m in layer.getmembers():
                p = "/" + m.name.lstrip("./")
                if m.isfile():
                    files[p] = m.mode
                    data[p] = layer.extractfile(m).read()
                elif m.issym():
                    links[p] = m.linkname
    return config["config"], files, links, data


def check(root, name, tar_path, df_name=None):
    """Failures (strings) of image `tar_path` against the Dockerfile of `df_name` (default `name`)."""
    want = declared(root, df_name or name)
    cfg, files, links, data = image(tar_path)
    errs = []
    dests = {d for _, d, _ in want["copies"]}
    for src, dest, ctx in want["copies"]:
        if dest not in files:
            errs.append(f"{dest}: declared (COPY {src}) but not in the image")
        elif ctx and data[dest] != open(os.path.join(root, src), "rb").read():
            errs.append(f"{dest}: differs from the build context's {src}")
    owned = {p for p in files if p.startswith(OWNED) or p == "/bin/busybox"} - {"/etc/fgpu-image"}
    for p in sorted(owned - dests):
        errs.append(f"{p}: in the image but not declared by deploy/images/{df_name or name}/Dockerfile")
    bin_links = sorted(os.path.basename(p) for p, t in links.items() if p.startswith("/bin/") and t == "busybox")
    if sorted(want["applets"]) != bin_links:
        errs.append(f"/bin applets {bin_links}, the Dockerfile links {sorted(want['applets'])}")
    if cfg.get("Entrypoint") != want["entrypoint"]:
        errs.append(f"Entrypoint {cfg.get('Entrypoint')}, the Dockerfile says {want['entrypoint']}")
    if (cfg.get("User") or "0:0") != (want["user"] or "0:0"):
        errs.append(f"User {cfg.get('User')}, the Dockerfile says {want['user']}")
    for k, v in want["labels"].items():
        if k.endswith("licenses") and cfg.get("Labels", {}).get(k) != v:
            errs.append(f"label {k}={cfg.get('Labels', {}).get(k)}, the Dockerfile says {v}")
    if IMAGES[df_name or name][2]:
        for p in files:
            b = os.path.basename(p)
            if "fake_cuda" in b or b.startswith(("libcuda.so", "libnvidia-ml.so")):
                errs.append(f"{p}: a production image must not carry a CUDA driver, NVML or their fake")
    return errs


def main():
    root, images_dir = sys.argv[1], sys.argv[2]
    passed = failed = 0
    for name in IMAGES:
        tar_path = os.path.join(images_dir, name + ".tar")
        if not os.path.exists(tar_path):
            print(f"FAIL: {tar_path} missing (hack/images.sh build)")
            failed += 1
            continue
        errs = check(root, name, tar_path)
        for e in errs:
            print(f"FAIL: {name}: {e}")
        if errs:
            failed += 1
        else:
            passed += 1
            print(f"ok: {name}.tar holds exactly what deploy/images/{IMAGES[name][0]}/Dockerfile declares")
    if "--self-test" in sys.argv:
        fake = os.path.join(images_dir, "kubelet-plugin-fake.tar")
        errs = check(root, "kubelet-plugin-fake", fake, df_name="kubelet-plugin") if os.path.exists(fake) else []
        if any("not declared" in e for e in errs) and any("production image" in e for e in errs):
            passed += 1
            print(f"ok: self-test: the fake image is refused as the production one ({len(errs)} findings)")
        else:
            failed += 1
            print(f"FAIL: self-test: the fake image passed as the production one: {errs}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
