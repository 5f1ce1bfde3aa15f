#!/usr/bin/env python3
"""The monitoring we ship, against a real Prometheus scraping the daemons (e2e 62).

    promql-check.py config SCRAPE RULES OUT --plugin ADDR --controller ADDR --node NAME
                          [--interval S]
        OUT: SCRAPE (deploy/monitoring/prometheus-scrape.yaml) with each job's Kubernetes
        pod discovery replaced by a static target carrying the labels its relabelling
        writes (Debian's Prometheus has no Kubernetes discovery), the intervals short, and
        rule_files the shipped RULES (an absolute path)
    promql-check.py queries URL DASHBOARD RULES --since UNIX [--expect-var NAME=VALUE]...
        every PromQL expression of DASHBOARD (every "expr" anywhere in the JSON, and the
        label_values() of its variables) and of RULES, queried at URL: each dashboard
        expression and variable must return data (a series with a finite value); each
        alert expression must evaluate (many are empty while nothing is wrong). Grafana's
        variables: each query variable becomes the values its label_values() returns
        (alternated, as Grafana renders a multi-value selection), which must include the
        --expect-var values; $__rate_interval, $__interval and $__range the time since
        --since (the dashboard's range covering the scenario), at least four scrapes
    promql-check.py show URL QUERY --label L
        one instant query: "<L's value>=<value>" per series, on one line
    promql-check.py alerts URL [--firing A,B] [--active A,B] [--inactive A,B] [--timeout S]
        /api/v1/rules: every rule loaded and healthy; then, polling up to --timeout
        seconds, /api/v1/alerts: each --firing alert firing, each --active one pending or
        firing, each --inactive one neither. Prints what it saw.
Exit status 1 with the failures listed.
"""
import argparse
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request

import yaml

GRAFANA_RANGES = re.compile(r"\$\{?(__rate_interval|__interval|__range)\}?")
GRAFANA_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)\]\]")
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_]\w*)\s*\)\s*$", re.S)
REGEX_SPECIAL = re.compile(r"([\\.^$|?*+()\[\]{}])")


def api(url, path, params=None):
    q = ("?" + urllib.parse.urlencode(params, doseq=True)) if params else ""
    try:
        with urllib.request.urlopen(f"{url}{path}{q}", timeout=20) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        body = json.load(e)
    except (urllib.error.URLError, OSError) as e:
        raise RuntimeError(f"{url}{path}: {getattr(e, 'reason', e)}") from None
    if body.get("status") != "success":
        raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}")
    return body["data"]


# ---------------------------------------------------------------------------- config

def config(a):
    with open(a.scrape) as f:
        cfg = yaml.safe_load(f)
    targets = {"fgpu-kubelet-plugin": (a.plugin, {"node": a.node}),
               "fgpu-controller": (a.controller, {})}
    jobs = []
    for job in cfg["scrape_configs"]:
        name = job["job_name"]
        if name not in targets:
            sys.exit(f"{a.scrape}: job {name}: no target for it here")
        addr, labels = targets.pop(name)
        # What the job's relabel_configs write from the pod (namespace, pod; node from
        # the pod's node on the plugin's job): the daemons run as host processes here.
        written = {r["target_label"] for r in job.get("relabel_configs", []) if "target_label" in r}
        static = {"namespace": "fgpu-system", "pod": f"{name}-host", **labels}
        missing = set(static) - written
        if missing:
            sys.exit(f"{a.scrape}: job {name} no longer writes {sorted(missing)}: update this scenario")
        out = {k: v for k, v in job.items() if k not in ("kubernetes_sd_configs", "relabel_configs")}
        out["static_configs"] = [{"targets": [addr], "labels": {k: static[k] for k in sorted(written)}}]
        jobs.append(out)
    if targets:
        sys.exit(f"{a.scrape}: no job {sorted(targets)}")
    cfg["global"] = {"scrape_interval": f"{a.interval}s", "scrape_timeout": f"{a.interval}s",
                     "evaluation_interval": "1s"}
    cfg["rule_files"] = [a.rules]
    cfg["scrape_configs"] = jobs
    with open(a.out, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)


# ---------------------------------------------------------------------------- queries

def dashboard_exprs(node, where="dashboard"):
    """Every "expr" in the JSON, with where it sits (panel titles)."""
    if isinstance(node, dict):
        here = f"{where} / {node['title']}" if isinstance(node.get("title"), str) else where
        for k, v in node.items():
            if k == "expr" and isinstance(v, str) and v.strip():
                yield here, v
            else:
                yield from dashboard_exprs(v, here)
    elif isinstance(node, list):
        for v in node:
            yield from dashboard_exprs(v, where)


def finite(result):
    """The finite values of an instant query's result."""
    if result["resultType"] == "scalar":
        vals = [result["result"][1]]
    else:
        vals = [s["value"][1] for s in result["result"]]
    return [float(v) for v in vals if not math.isnan(float(v)) and not math.isinf(float(v))]


def short(expr, n=110):
    e = " ".join(expr.split())
    return e if len(e) <= n else e[: n - 1] + "…"


def queries(a):
    with open(a.dashboard) as f:
        dash = json.load(f)
    with open(a.rules) as f:
        rules = yaml.safe_load(f)
    window = max(int(time.time() - a.since) + 5, 4 * a.scrape_interval)
    rng = f"{window}s"
    expect = {}
    for e in a.expect_var:
        k, _, v = e.partition("=")
        expect.setdefault(k, []).append(v)
    failures, checked = [], 0
    values = {}

    def subst(expr):
        expr = GRAFANA_RANGES.sub(rng, expr)

        def var(m):
            name = m.group(1) or m.group(2) or m.group(3)
            if not values.get(name):
                raise KeyError(name)
            vs = [REGEX_SPECIAL.sub(r"\\\1", v) for v in values[name]]
            return vs[0] if len(vs) == 1 else "(" + "|".join(vs) + ")"
        return GRAFANA_VAR.sub(var, expr)

    # The variables, in order (each may use the ones before), from label_values().
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        checked += 1
        m = LABEL_VALUES.match(q or "")
        if not m:
            failures.append(f"variable {v['name']}: not label_values(series, label): {q!r}")
            continue
        try:
            sel = subst(m.group(1))
            series = api(a.url, "/api/v1/series", {"match[]": sel, "start": str(a.since)})
        except (KeyError, RuntimeError) as e:
            failures.append(f"variable {v['name']}: {q}: {e}")
            continue
        got = sorted({s[m.group(2)] for s in series if m.group(2) in s})
        values[v["name"]] = got
        want = expect.get(v["name"], [])
        ok = bool(got) and all(w in got for w in want)
        print(f"  {'ok  ' if ok else 'FAIL'} variable ${v['name']} = {', '.join(got) or '(none)'}"
              + (f" (want {', '.join(want)} among them)" if want else ""))
        if not ok:
            failures.append(f"variable {v['name']}: {q} gave {got}, want {want or 'some'}")

    def run(what, expr, must_have_data):
        nonlocal checked
        checked += 1
        try:
            q = subst(expr)
            res = api(a.url, "/api/v1/query", {"query": q})
        except KeyError as e:
            failures.append(f"{what}: variable ${e.args[0]} undefined or without values: {short(expr)}")
            print(f"  FAIL {what}: variable ${e.args[0]} undefined or without values")
            return None
        except RuntimeError as e:
            failures.append(f"{what}: {short(expr)}: {e}")
            print(f"  FAIL {what}: {short(expr)}: {e}")
            return None
        n = len(res["result"]) if res["resultType"] != "scalar" else 1
        fin = finite(res)
        if must_have_data and not fin:
            failures.append(f"{what}: no data ({n} series, none finite): {short(q, 300)}")
            print(f"  FAIL {what}: {n} series, none finite: {short(q)}")
        else:
            sample = f", e.g. {fin[0]:g}" if fin else ""
            print(f"  ok   {what}: {n} series{sample}: {short(expr)}")
        return res

    for where, expr in dashboard_exprs(dash.get("panels", [])):
        run(where, expr, True)
    alerts = 0
    for g in rules.get("groups", []):
        for r in g.get("rules", []):
            name = r.get("alert") or r.get("record")
            alerts += 1
            # Alerts are empty while nothing is wrong: only that they evaluate.
            run(f"rule {name}", r["expr"], "record" in r)
    nvars = sum(1 for v in dash.get("templating", {}).get("list", []) if v.get("type") == "query")
    print(f"  {checked} expressions checked: {checked - alerts - nvars} panel targets and {nvars} variables "
          f"of the dashboard, {alerts} rules; window {rng}")
    if failures:
        print(f"{len(failures)} failure(s):")
        for f in failures:
            print(f"  - {f}")
        sys.exit(1)


def show(a):
    res = api(a.url, "/api/v1/query", {"query": a.query})
    print(" ".join(f"{r['metric'].get(a.label, '?')}={float(r['value'][1]):.2f}" for r in res["result"]))


# ---------------------------------------------------------------------------- alerts

def names(s):
    return [n for n in (s or "").split(",") if n]


def alerts(a):
    failures = []
    groups = api(a.url, "/api/v1/rules")["groups"]
    loaded = {}
    for g in groups:
        for r in g["rules"]:
            loaded[r["name"]] = r
            if r.get("health") not in ("ok", "unknown") or r.get("lastError"):
                failures.append(f"rule {r['name']}: health {r.get('health')}: {r.get('lastError')}")
    for n in names(a.firing) + names(a.active) + names(a.inactive):
        if n not in loaded:
            failures.append(f"alert {n} is not loaded (loaded: {', '.join(sorted(loaded))})")
    deadline = time.time() + a.timeout
    while True:
        state = {}
        for al in api(a.url, "/api/v1/alerts")["alerts"]:
            n = al["labels"].get("alertname")
            # firing wins over pending when several series of one alert differ
            if state.get(n) != "firing":
                state[n] = al["state"]
        bad = [f"{n} is {state.get(n, 'inactive')}, want firing" for n in names(a.firing) if state.get(n) != "firing"]
        bad += [f"{n} is inactive, want pending or firing" for n in names(a.active) if n not in state]
        bad += [f"{n} is {state[n]}, want inactive" for n in names(a.inactive) if n in state]
        if not bad or time.time() >= deadline:
            break
        time.sleep(1)
    print(f"  rules loaded: {len(loaded)}, unhealthy: {sum(1 for f in failures if f.startswith('rule '))}")
    for n in sorted(loaded):
        if loaded[n].get("type") == "alerting":
            print(f"  {n}: {state.get(n, 'inactive')}")
    failures += bad
    if failures:
        print(f"{len(failures)} failure(s):")
        for f in failures:
            print(f"  - {f}")
        for al in api(a.url, "/api/v1/alerts")["alerts"]:
            print(f"  alert: {json.dumps(al['labels'], sort_keys=True)} {al['state']} value {al.get('value')}")
        sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("config")
    c.add_argument("scrape")
    c.add_argument("rules")
    c.add_argument("out")
    c.add_argument("--plugin", required=True)
    c.add_argument("--controller", required=True)
    c.add_argument("--node", required=True)
    c.add_argument("--interval", type=int, default=1)
    q = sub.add_parser("queries")
    q.add_argument("url")
    q.add_argument("dashboard")
    q.add_argument("rules")
    q.add_argument("--since", type=float, required=True)
    q.add_argument("--scrape-interval", type=int, default=1)
    q.add_argument("--expect-var", action="append", default=[])
    sh = sub.add_parser("show")
    sh.add_argument("url")
    sh.add_argument("query")
    sh.add_argument("--label", required=True)
    al = sub.add_parser("alerts")
    al.add_argument("url")
    al.add_argument("--firing")
    al.add_argument("--active")
    al.add_argument("--inactive")
    al.add_argument("--timeout", type=float, default=0)
    a = p.parse_args()
    try:
        {"config": config, "queries": queries, "show": show, "alerts": alerts}[a.cmd](a)
    except RuntimeError as e:
        sys.exit(f"{a.cmd}: {e}")


if __name__ == "__main__":
    main()
