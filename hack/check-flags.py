#!/usr/bin/env python3
"""Checks that fgpu's binaries spell the same thing the same way.

Runs `--help` of every subcommand of fgpu-kubelet-plugin, fgpu-controller and fgpu-sim
(from BIN_DIR, default $CARGO_TARGET_DIR/debug) and checks:

  1. every command takes the logging flags (--log-format, --log-level), and every daemon
     (a command that talks to the API server) takes --kubeconfig;
  2. no command spells a shared concept another way (--driver for --driver-name,
     --metrics-addr for --metrics-address, --resync for --resync-seconds, ...);
  3. a flag that several commands take has the same value name and the same environment
     variable in each (defaults may differ: a resync period is the daemon's own choice).

Prints one line per problem and exits 1 if there is any, else prints the shared flags
and exits 0. `--self-test` checks the checker against made-up help texts.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

COMMANDS = [
    # (binary, subcommand words, talks to the API server)
    ("fgpu-kubelet-plugin", ["serve"], True),
    ("fgpu-kubelet-plugin", ["device-plugin"], True),
    ("fgpu-kubelet-plugin", ["discover"], False),
    ("fgpu-controller", ["run"], True),
    ("fgpu-controller", ["extender"], True),
    ("fgpu-sim", [], False),
    ("fgpu-sim", ["plot"], False),
]

EVERYWHERE = ["--log-format", "--log-level"]
DAEMONS = ["--kubeconfig"]

# Spellings of a shared concept that are not ours, and the one that is.
NOT_OURS = {
    "--driver": "--driver-name",
    "--driver-name-prefix": "--driver-name",
    "--metrics-addr": "--metrics-address",
    "--metrics-port": "--metrics-address",
    "--metrics-bind-address": "--metrics-address",
    "--resync": "--resync-seconds",
    "--resync-period": "--resync-seconds",
    "--kube-config": "--kubeconfig",
    "--log-json": "--log-format",
    "--verbose": "--log-level",
    "--webhook-address": "--webhook-addr",
    "--cert": "--tls-cert",
    "--key": "--tls-key",
}

# Differences that are meant, with the reason: (flag, what differs, command) -> why.
EXEMPT = {
    ("--node", "env", "fgpu-kubelet-plugin discover"):
        "a tool run by hand: $NODE_NAME from a shell would silently filter a multi-node "
        "fake profile; the daemons take it from the downward API",
}

FLAG_LINE = re.compile(r"^\s{1,8}(?:-[A-Za-z], )?(--[a-z0-9][a-z0-9-]*)(?:[ =]<([^>]+)>)?")
ENV = re.compile(r"\[env: ([A-Z0-9_]+)=")


def parse_help(text):
    """{flag: {"value": VALUE or None, "env": NAME or None}} from a clap long help."""
    flags = {}
    current = None
    for line in text.splitlines():
        m = FLAG_LINE.match(line)
        if m:
            current = m.group(1)
            flags[current] = {"value": m.group(2), "env": None}
            continue
        if current:
            e = ENV.search(line)
            if e:
                flags[current]["env"] = e.group(1)
    flags.pop("--help", None)
    flags.pop("--version", None)
    return flags


def check(helps):
    """Problems in {name: (help text, daemon?)}."""
    problems = []
    parsed = {name: parse_help(text) for name, (text, _) in helps.items()}
    for name, (_, daemon) in helps.items():
        flags = parsed[name]
        for f in EVERYWHERE + (DAEMONS if daemon else []):
            if f not in flags:
                problems.append(f"{name}: no {f}")
        for f in flags:
            if f in NOT_OURS:
                problems.append(f"{name}: {f}: fgpu spells this {NOT_OURS[f]}")
    seen = {}
    for name, flags in parsed.items():
        for f, info in flags.items():
            seen.setdefault(f, []).append((name, info))
    shared = {f: uses for f, uses in seen.items() if len(uses) > 1}
    for f, uses in sorted(shared.items()):
        for key in ("value", "env"):
            kinds = {info[key] for n, info in uses if (f, key, n) not in EXEMPT}
            if len(kinds) > 1:
                detail = ", ".join(f"{n}: {info[key]}" for n, info in uses)
                problems.append(f"{f}: differs in its {key} between commands ({detail})")
    return problems, shared


def run_helps(bin_dir):
    helps = {}
    for binary, words, daemon in COMMANDS:
        path = os.path.join(bin_dir, binary)
        if not os.access(path, os.X_OK):
            sys.exit(f"check-flags: {path}: not built (cargo build -p {binary})")
        out = subprocess.run([path, *words, "--help"], capture_output=True, text=True,
                             env={**os.environ, "COLUMNS": "200"})
        if out.returncode != 0:
            sys.exit(f"check-flags: {binary} {' '.join(words)} --help exited {out.returncode}:"
                     f" {out.stderr.strip()}")
        helps[" ".join([binary, *words])] = (out.stdout, daemon)
    return helps


GOOD = """Usage: x [OPTIONS]

Options:
      --log-format <LOG_FORMAT>
          Log line format

          [env: FGPU_LOG_FORMAT=]
          [default: text]

      --log-level <FILTER>
          Log filter

          [env: FGPU_LOG_LEVEL=]

      --kubeconfig <FILE>
          Kubeconfig file

          [env: FGPU_KUBECONFIG=]

      --driver-name <DRIVER_NAME>
          The driver

          [env: FGPU_DRIVER_NAME=]

  -h, --help
          Print help
"""


def self_test():
    ok = True

    def expect(what, helps, want):
        nonlocal ok
        problems, _ = check(helps)
        got = bool(problems)
        if got != want:
            ok = False
            print(f"self-test FAILED: {what}: problems {problems}")
        else:
            print(f"self-test ok: {what}")

    expect("two consistent commands", {"a": (GOOD, True), "b": (GOOD, True)}, False)
    expect("a foreign spelling", {"a": (GOOD, True),
                                  "b": (GOOD + "      --metrics-addr <ADDR>\n", True)}, True)
    expect("a different value name", {"a": (GOOD, True),
                                       "b": (GOOD.replace("<FILTER>", "<LEVEL>"), True)}, True)
    expect("a different env var", {"a": (GOOD, True),
                                    "b": (GOOD.replace("FGPU_DRIVER_NAME", "DRIVER"), True)}, True)
    expect("a daemon without --kubeconfig",
           {"a": (GOOD.replace("--kubeconfig", "--other"), True)}, True)
    expect("a tool without --kubeconfig",
           {"a": (GOOD.replace("--kubeconfig", "--other"), False)}, False)
    expect("no --log-level", {"a": (GOOD.replace("--log-level", "--level"), False)}, True)
    with tempfile.TemporaryDirectory() as d:
        # The real entry point against a fake binary that prints a bad help.
        for b in {c[0] for c in COMMANDS}:
            p = os.path.join(d, b)
            with open(p, "w") as f:
                f.write("#!/bin/sh\ncat <<'EOF'\n" + GOOD + "      --resync <SECONDS>\nEOF\n")
            os.chmod(p, 0o755)
        problems, _ = check(run_helps(d))
        if not any("--resync: fgpu spells this --resync-seconds" in p for p in problems):
            ok = False
            print(f"self-test FAILED: fake binaries: {problems}")
        else:
            print("self-test ok: fake binaries with --resync")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Exit status: 0 consistent, 1 problems found.")
    ap.add_argument("bin_dir", nargs="?",
                    default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "debug"),
                    help="directory with the built binaries (default: $CARGO_TARGET_DIR/debug)")
    ap.add_argument("--self-test", action="store_true", help="check the checker and exit")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    problems, shared = check(run_helps(args.bin_dir))
    for p in problems:
        print(f"check-flags: {p}")
    if problems:
        return 1
    print("check-flags: consistent; flags shared by several commands:")
    for f, uses in sorted(shared.items()):
        print(f"  {f:<26} {len(uses)} commands: {', '.join(n for n, _ in uses)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
