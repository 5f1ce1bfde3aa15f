#!/usr/bin/env python3
"""Checks fgpu's monitoring artefacts against the code (hack/monitoring-check.sh runs it).

    monitoring-check.py ROOT PROMTOOL            check everything, print one line per check
    monitoring-check.py ROOT PROMTOOL --update   regenerate deploy/monitoring/prometheus-rules.yaml
    monitoring-check.py ROOT PROMTOOL --self-test
                                                 break each artefact on purpose and require the
                                                 check that guards it to fail

What is checked:
  * the metric families the daemons export, read from the Rust source: every
    `Registry::with_prefix` registry's `register` calls (the kind from the registered
    value's declared type, the labels from its label-set struct) and the families of its
    `Collector`s. prometheus-client appends `_total` to counters, `_bucket`/`_sum`/`_count`
    to histograms;
  * the alert rules: `promtool check rules`, `promtool test rules` on
    deploy/monitoring/tests/alerts-test.yaml, and per alert two mutants (always firing,
    never firing) that the tests must reject, so every alert has a case that fires and one
    that stays silent;
  * the dashboard: valid JSON, Grafana's shape (schemaVersion, the `${datasource}`
    variable on every panel and target, unique panel ids, the rows Cluster, Node, GPU and
    Claim), every expression (panels and variables) parsed by promtool (as throwaway
    recording rules, with Grafana's variables substituted), every metric name one the code
    exports (or `up`), every label in a matcher one the family has or the scrape adds,
    every `by`/`on` label one of the expression's families has, every `$variable` defined;
  * every dashboard expression returns data (absent(expr) empty, promtool test rules) from
    an hour of series shaped like the daemons' exposition (SAMPLE_LABELS);
  * the same name and label checks on the alert expressions;
  * docs/observability.md's tables of panels and alerts list exactly the families each uses;
  * deploy/monitoring/prometheus-rules.yaml is the rule file wrapped in a PrometheusRule
    (regenerate with --update); the symlinks in deploy/monitoring/ point at the chart's files;
  * deploy/monitoring/podmonitor.yaml and servicemonitor.yaml select the pods and the Service of
    deploy/kubelet-plugin/daemonset.yaml and deploy/controller/controller.yaml, on a port named
    as in those manifests;
  * deploy/monitoring/prometheus-scrape.yaml with `promtool check config`, its
    kubernetes_sd_configs replaced by a static target (Debian's promtool is built without
    Kubernetes discovery and refuses the field).

Not checked here: that an expression returns data from a real Prometheus scraping the
running daemons (that needs a cluster: e2e), Grafana's rendering; label values only as far
as SAMPLE_LABELS holds the values the code writes.
"""
import copy
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

MON = "deploy/monitoring"
CHART_FILES = "deploy/helm/fgpu/files/monitoring"
RULES = f"{CHART_FILES}/prometheus-rules.rules.yaml"
DASHBOARD = f"{CHART_FILES}/grafana-dashboard.json"
ALERT_TESTS = f"{MON}/tests/alerts-test.yaml"
PROMETHEUS_RULE = f"{MON}/prometheus-rules.yaml"
DOC = "docs/observability.md"
LINKS = {f"{MON}/prometheus-rules.rules.yaml": RULES, f"{MON}/grafana-dashboard.json": DASHBOARD}
# Families Prometheus itself writes for every target.
PROMETHEUS_SERIES = {"up": set()}
# Labels a scrape adds: job and instance always; the PodMonitor, the ServiceMonitor and
# prometheus-scrape.yaml add node (the plugin's), namespace, pod; the Operator also
# container, endpoint, service.
TARGET_LABELS = {"job", "instance", "node", "namespace", "pod", "container", "endpoint", "service"}
ROWS = ("Cluster", "Node", "GPU", "Claim")


class CheckError(Exception):
    pass


# --------------------------------------------------------------------------------------
# What the code exports


def _strip_comments(text):
    """Rust without its // comments (doc comments name metrics too)."""
    return re.sub(r"//[^\n]*", "", text)


def _kind(decl, where):
    words = set(re.findall(r"\b(Histogram|Counter|Gauge|Info)\b", decl))
    if len(words) != 1:
        raise CheckError(f"{where}: cannot tell the metric kind of `{decl.strip()}` (found {sorted(words) or 'none'})")
    return words.pop().lower()


def _block(text, start):
    """The text between the brace at or after start and its match."""
    i = text.index("{", start) + 1
    depth, j = 1, i
    while depth and j < len(text):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i:j - 1]


def _struct_fields(text, name, where):
    m = re.search(rf"\bstruct\s+{name}\b[^{{;]*\{{", text)
    if not m:
        raise CheckError(f"{where}: no struct {name}")
    fields = {}
    for line in _block(text, m.start()).splitlines():
        f = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?([a-z_][a-z0-9_]*)\s*:\s*(.+?),?\s*$", line)
        if f:
            fields[f.group(1)] = f.group(2)
    return fields


def _impl_type(text, pos, where):
    impls = list(re.finditer(r"^impl(?:<[^>]*>)?\s+([A-Z]\w*)\s*\{", text[:pos], re.M))
    if not impls:
        raise CheckError(f"{where}: register call outside an `impl Type {{`")
    return impls[-1].group(1)


def _type_of(text, path, pos, where):
    """The declared type (or the initialiser) of `a`, `a.b`, `a.b.c` at pos: locals by their
    last `let` before pos, `self`/`Self { .. }` as the impl's type, fields by their struct."""
    parts = path.split(".")
    head, rest = parts[0], parts[1:]
    if head == "self":
        ty = _impl_type(text, pos, where)
    else:
        lets = list(re.finditer(rf"\blet\s+(?:mut\s+)?{head}\s*(?::\s*([^=]+?))?\s*=\s*&?\s*([^;]+);", text[:pos]))
        if not lets:
            raise CheckError(f"{where}: no `let {head}` before its register call")
        ann, init = lets[-1].group(1), lets[-1].group(2).strip()
        if ann:
            ty = ann.strip().lstrip("&")
        elif re.match(r"Self\s*(\{|::)", init):
            ty = _impl_type(text, pos, where)
        elif re.fullmatch(r"[a-z_][a-z0-9_.]*", init):
            ty = _type_of(text, init, lets[-1].start(), where)
        else:
            ty = init
    for field in rest:
        name = re.match(r"[A-Za-z_]\w*", ty)
        fields = _struct_fields(text, name.group(0) if name else ty, where)
        if field not in fields:
            raise CheckError(f"{where}: struct {ty} has no field {field}")
        ty = fields[field]
    return ty


def _label_names(text, decl, where):
    """Label names of a declared metric type: the fields of its label-set struct, or for a
    `Vec<(String, String)>` label set every `("name".to_owned(), ...)` key in the file (a
    superset: exact is False)."""
    m = re.search(r"Family\s*(?:::)?\s*<\s*([A-Za-z_][A-Za-z0-9_]*)", decl)
    if not m:
        return set(), True
    name = m.group(1)
    alias = re.search(rf"\btype\s+{name}\s*=\s*([^;]+);", text)
    if alias:
        if re.sub(r"\s", "", alias.group(1)) != "Vec<(String,String)>":
            raise CheckError(f"{where}: label set {name} = {alias.group(1)}: not read by the checker")
        return set(re.findall(r'\(\s*"([a-z_][a-z0-9_]*)"\.to_owned\(\)', text)), False
    return set(_struct_fields(text, name, where)), True


def _collector_families(text, prefix, where):
    """The families each `impl Collector` encodes: one MetricType, the names of its
    ("name", "help", ...) tuples, the labels of its ("label", value) pairs."""
    out = {}
    for m in re.finditer(r"impl\s+Collector\s+for\s+\w+\s*\{", text):
        block = _block(text, m.start())
        kinds = set(re.findall(r"MetricType::(\w+)", block))
        if len(kinds) != 1:
            raise CheckError(f"{where}: a Collector encodes {sorted(kinds) or 'no'} metric types; the checker reads one")
        kind = kinds.pop().lower()
        names = re.findall(r'\(\s*"([a-z_][a-z0-9_]*)"\s*,\s*"', block)
        labels = set(re.findall(r'\(\s*"([a-z_][a-z0-9_]*)"\s*,(?!\s*")', block))
        if not names:
            raise CheckError(f"{where}: a Collector with no (\"name\", \"help\", …) families")
        for n in names:
            out[f"{prefix}_{n}"] = (kind, labels, True)
    return out


def exported(sources):
    """({family: (kind, labels, exact)}, [registry prefixes]) from {path: Rust source}."""
    fams, seen = {}, []
    for path, raw in sorted(sources.items()):
        text = _strip_comments(raw)
        prefixes = re.findall(r'Registry::with_prefix\(\s*"([a-z_][a-z0-9_]*)"\s*\)', text)
        if not prefixes:
            continue
        if len(set(prefixes)) != 1:
            raise CheckError(f"{path}: several registry prefixes {prefixes}; the checker reads one per file")
        prefix = prefixes[0]
        seen.append(prefix)
        if re.search(r"\.register_with_unit\(|sub_registry_with", text):
            raise CheckError(f"{path}: register_with_unit / sub registries are not read by the checker: extend it")
        calls = list(re.finditer(r'\.register\(\s*"([a-z_][a-z0-9_]*)"\s*,\s*"(?:[^"\\]|\\.)*"\s*,\s*([^;]*?)\s*,?\s*\)\s*;', text))
        if len(calls) != len(re.findall(r"\.register\(", text)):
            raise CheckError(f"{path}: a register call the checker cannot read")
        for c in calls:
            name, value = c.group(1), c.group(2)
            m = re.fullmatch(r"([a-z_][a-z0-9_.]*?)(?:\.clone\(\))?", value)
            if not m:
                raise CheckError(f"{path}: register(\"{name}\", ..., {value}): not a path or path.clone()")
            decl = _type_of(text, m.group(1), c.start(), f"{path} {name}")
            fams[f"{prefix}_{name}"] = (_kind(decl, f"{path} {name}"), *_label_names(text, decl, f"{path} {name}"))
        if "register_collector(" in text:
            fams.update(_collector_families(text, prefix, path))
    if not fams:
        raise CheckError("no metric families found in the Rust source")
    return fams, sorted(set(seen))


def exposed(fam, kind):
    """The family's name in the exposition: counters end in _total, info in _info."""
    return fam + {"counter": "_total", "info": "_info"}.get(kind, "")


def series_names(fams):
    """{series name: (family, labels)} as prometheus-client writes them."""
    out = {}
    for fam, (kind, labels, _) in fams.items():
        if kind == "histogram":
            for s in ("_bucket", "_sum", "_count"):
                out[fam + s] = (fam, labels | ({"le"} if s == "_bucket" else set()))
        else:
            out[exposed(fam, kind)] = (exposed(fam, kind), labels)
    for n, labels in PROMETHEUS_SERIES.items():
        out[n] = (n, labels)
    return out


def rust_sources(root):
    files = subprocess.run(["git", "-C", root, "ls-files", "*.rs"], capture_output=True, text=True,
                           check=True).stdout.split()
    return {f: open(os.path.join(root, f), encoding="utf-8").read()
            for f in files if os.path.exists(os.path.join(root, f))}


# --------------------------------------------------------------------------------------
# PromQL, as far as names go

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
            "bool", "offset", "inf", "nan", "atan2", "start", "end"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
TOKEN = re.compile(r"""\s+|(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)|(?P<num>[0-9][0-9a-zA-Z.]*)"""
                   r"""|(?P<id>[a-zA-Z_:][a-zA-Z0-9_:]*)|(?P<op>=~|!~|!=|==|<=|>=|[-+*/%^(){}\[\],=<>@])""")
GRAFANA_RANGES = re.compile(r"\$(?:__rate_interval|__interval|__range)\b|\$\{(?:__rate_interval|__interval|__range)\}")
GRAFANA_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)\]\]")


def grafana_vars(expr):
    return {a or b or c for a, b, c in GRAFANA_VAR.findall(GRAFANA_RANGES.sub("", expr))}


def substitute(expr):
    """Grafana's variables replaced so promtool can parse the expression."""
    return GRAFANA_VAR.sub("x", GRAFANA_RANGES.sub("5m", expr))


def tokens(expr):
    out, i = [], 0
    while i < len(expr):
        m = TOKEN.match(expr, i)
        if not m:
            raise CheckError(f"cannot read `{expr[i:i + 20]}` in {expr!r}")
        i = m.end()
        if m.lastgroup:
            out.append((m.lastgroup, m.group(m.lastgroup)))
    return out


def selectors(expr):
    """([(metric, {matcher labels})], {grouping labels}) of an expression."""
    toks = tokens(expr)
    sels, grouping, i = [], set(), 0
    while i < len(toks):
        kind, val = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "op" and val == "[":
            while i < len(toks) and toks[i][1] != "]":
                i += 1
        elif kind == "id" and val in GROUPING and nxt == "(":
            i += 2
            while i < len(toks) and toks[i][1] != ")":
                if toks[i][0] == "id":
                    grouping.add(toks[i][1])
                i += 1
        elif kind == "id" and ((nxt == "(" and val not in KEYWORDS) or val in AGGREGATIONS):
            pass  # a function or an aggregation
        elif (kind == "id" and val not in KEYWORDS) or (kind == "op" and val == "{"):
            name = val if kind == "id" else None
            labels = set()
            if kind == "op" or nxt == "{":
                i += 1 if kind == "op" else 2
                while i < len(toks) and toks[i][1] != "}":
                    if toks[i][0] == "id" and i + 1 < len(toks) and toks[i + 1][1] in ("=", "!=", "=~", "!~"):
                        labels.add(toks[i][1])
                    i += 1
            if name is None or "__name__" in labels:
                raise CheckError(f"a selector without a plain metric name in {expr!r}: the name check needs one")
            sels.append((name, labels))
        i += 1
    return sels, grouping


def check_names(expr, series, where):
    """Every metric exported, every matcher label one it has, every grouping label one of
    its families has. Returns the families used."""
    sels, grouping = selectors(substitute(expr))
    if not sels:
        raise CheckError(f"{where}: no metric in {expr!r}")
    fams, all_labels = set(), set(TARGET_LABELS)
    for name, labels in sels:
        if name not in series:
            raise CheckError(f"{where}: `{name}` is not a series the daemons export (renamed? see the Rust source) in {expr!r}")
        fam, have = series[name]
        fams.add(fam)
        allowed = have | TARGET_LABELS
        bad = labels - allowed
        if bad:
            raise CheckError(f"{where}: {name} has no label {sorted(bad)} (it has {sorted(have)}, the scrape adds {sorted(TARGET_LABELS)})")
        all_labels |= have
    bad = grouping - all_labels
    if bad:
        raise CheckError(f"{where}: by/on label {sorted(bad)} is on none of {sorted(fams)} in {expr!r}")
    return fams


def promtool_parse(promtool, exprs):
    """Parses every (where, expr) with promtool check rules (as recording rules)."""
    rules = [{"record": f"fgpu_check:expr_{i}", "expr": substitute(e)} for i, (_, e) in enumerate(exprs)]
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "exprs.yaml")
        with open(f, "w") as out:
            yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, out)
        p = subprocess.run([promtool, "check", "rules", f], capture_output=True, text=True)
    if p.returncode != 0:
        detail = (p.stdout + p.stderr).strip()
        bad = sorted({int(n) for n in re.findall(r"expr_(\d+)", detail)})
        raise CheckError(f"promtool cannot parse a dashboard expression:\n{detail}\n"
                         + "\n".join(f"  expr_{i}: {exprs[i][0]}: {exprs[i][1]}" for i in bad))


# --------------------------------------------------------------------------------------
# The dashboard


def all_panels(dash):
    for p in dash.get("panels", []):
        yield p
        for q in p.get("panels", []) or []:
            yield q


def dashboard_exprs(dash):
    """[(where, expr, row, panel title)] of panels and variables."""
    out, row = [], None
    for p in all_panels(dash):
        if p.get("type") == "row":
            row = p.get("title")
            continue
        for t in p.get("targets", []):
            out.append((f"panel {p.get('id')} \"{p.get('title')}\" {t.get('refId')}", t.get("expr", ""), row, p.get("title")))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_]\w*)\s*\)\s*", q or "")
        if not m:
            raise CheckError(f"variable {v.get('name')}: only label_values(<selector>, <label>) is read by the checker, got {q!r}")
        out.append((f"variable {v['name']}", m.group(1), None, None))
        out.append((f"variable {v['name']} label", f"sum by ({m.group(2)}) ({m.group(1)})", None, None))
    return out


def check_dashboard(dash, series, promtool, report):
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        raise CheckError(f"dashboard: schemaVersion {dash.get('schemaVersion')!r}, want an int >= 36 (Grafana 9+)")
    for k in ("uid", "title"):
        if not dash.get(k):
            raise CheckError(f"dashboard: no {k}")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        raise CheckError("dashboard: no variable `datasource` of type datasource, query prometheus")
    report("dashboard: Grafana schema %d, uid %s, a prometheus datasource variable" % (dash["schemaVersion"], dash["uid"]))
    ids, rows = set(), []
    for p in all_panels(dash):
        if p.get("id") in ids:
            raise CheckError(f"dashboard: panel id {p.get('id')} twice")
        ids.add(p.get("id"))
        if "gridPos" not in p:
            raise CheckError(f"dashboard: panel {p.get('id')} has no gridPos")
        if p.get("type") == "row":
            rows.append(p.get("title"))
            continue
        want = {"type": "prometheus", "uid": "${datasource}"}
        if p.get("datasource") != want:
            raise CheckError(f"dashboard: panel {p.get('id')} \"{p.get('title')}\" datasource {p.get('datasource')}, want {want}")
        if not p.get("targets"):
            raise CheckError(f"dashboard: panel {p.get('id')} \"{p.get('title')}\" has no query")
        for t in p["targets"]:
            if t.get("datasource") != want or not t.get("expr", "").strip():
                raise CheckError(f"dashboard: panel {p.get('id')} {t.get('refId')}: datasource {t.get('datasource')} / empty expr")
    if [r for r in rows if r in ROWS] != list(ROWS):
        raise CheckError(f"dashboard: rows {rows}, want {list(ROWS)} in that order")
    for v in variables.values():
        if v.get("type") == "query" and v.get("datasource") != {"type": "prometheus", "uid": "${datasource}"}:
            raise CheckError(f"dashboard: variable {v.get('name')} does not use ${{datasource}}")
    report(f"dashboard: {len(ids)} panels, rows {', '.join(rows)}, every panel and target on ${{datasource}}")
    exprs = dashboard_exprs(dash)
    for where, e, _, _ in exprs:
        undefined = grafana_vars(e) - set(variables)
        if undefined:
            raise CheckError(f"dashboard {where}: undefined variable(s) {sorted(undefined)} in {e!r}")
    promtool_parse(promtool, [(w, e) for w, e, _, _ in exprs])
    report(f"dashboard: promtool parses all {len(exprs)} expressions (panels and variables)")
    panels = {}
    for where, e, row, title in exprs:
        fams = check_names(e, series, f"dashboard {where}")
        if title is not None:
            panels.setdefault((row, title), set()).update(fams)
    n = len({f for fs in panels.values() for f in fs})
    report(f"dashboard: every metric is exported by the code and every label is one it has ({n} families)")
    return panels


# Series shaped like the daemons' exposition, for check_dashboard_data: one series per
# family with every label it has, at these values (the values the code writes; the plugin
# and the controller both name a GPU by its UUID, gpu_uuid), one sample a minute for an hour.
SAMPLE_LABELS = {"operation": "Prepare", "result": "ok", "phase": "Build", "reason": "no_fit", "read": "CacheHit",
                 "namespace": "ml", "claim": "train-0", "gpu_uuid": "GPU-0001", "kind": "memory",
                 "action": "report", "cause": "usage", "mode": "capacity", "node": "gpu-a"}
SAMPLE_TARGETS = {"fgpu_kubelet_plugin": {"job": "fgpu-system/fgpu-kubelet-plugin", "instance": "10.88.0.11:9400",
                                          "node": "gpu-a", "gpu": "GPU-0001"},
                  "fgpu_controller": {"job": "fgpu-controller", "instance": "10.88.1.21:19500"},
                  "fgpu_extender": {"job": "fgpu-extender", "instance": "10.88.1.31:19502"}}


def sample_series(fams):
    out = []
    for fam, (kind, labels, _) in sorted(fams.items()):
        target = next(t for p, t in SAMPLE_TARGETS.items() if fam.startswith(p + "_"))
        ls = {k: v for k, v in target.items() if k != "gpu"}
        ls.update({l: target.get("gpu", "gpu-0") if l == "gpu" else SAMPLE_LABELS.get(l, f"{l}-0") for l in sorted(labels)})

        def sel(name, extra=None):
            return name + "{" + ",".join(f'{k}="{v}"' for k, v in {**ls, **(extra or {})}.items()) + "}"
        if kind == "histogram":
            out += [{"series": sel(fam + "_bucket", {"le": le}), "values": "0+1x60"} for le in ("0.001", "+Inf")]
            out += [{"series": sel(fam + "_sum"), "values": "0+0.001x60"}, {"series": sel(fam + "_count"), "values": "0+1x60"}]
        elif kind == "counter":
            out.append({"series": sel(exposed(fam, kind)), "values": "0+1x60"})
        else:
            out.append({"series": sel(exposed(fam, kind)), "values": "1x60"})
    for t in SAMPLE_TARGETS.values():
        out.append({"series": "up{" + f'job="{t["job"]}",instance="{t["instance"]}"' + "}", "values": "1x60"})
    return out


def check_dashboard_data(dash, fams, promtool, report):
    """Every dashboard expression returns data from series shaped like the daemons' (the
    variables at All): absent(expr) must be empty, with promtool test rules."""
    exprs = dashboard_exprs(dash)
    tests = [{"expr": f"absent({GRAFANA_VAR.sub('.*', GRAFANA_RANGES.sub('5m', e))})", "eval_time": "30m",
              "exp_samples": []} for _, e, _, _ in exprs]
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "data.yaml")
        with open(f, "w") as out:
            yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m",
                            "tests": [{"interval": "1m", "input_series": sample_series(fams), "promql_expr_test": tests}]}, out)
        p = subprocess.run([promtool, "test", "rules", f], capture_output=True, text=True)
    if p.returncode != 0:
        empty = re.findall(r'expr: "absent\((.*)\)", time', p.stdout + p.stderr)
        where = [w for w, e, _, _ in exprs if any(GRAFANA_VAR.sub(".*", GRAFANA_RANGES.sub("5m", e)) in x.replace('\\"', '"') for x in empty)]
        raise CheckError("dashboard: queries that return nothing from series shaped like the daemons' "
                         f"(label values: {SAMPLE_LABELS}):\n  " + "\n  ".join(where or empty)
                         + f"\n{(p.stdout + p.stderr).strip()[:3000]}")
    report(f"dashboard: all {len(exprs)} expressions return data from series shaped like the daemons' (promtool test rules)")


# --------------------------------------------------------------------------------------
# The alerts


def alert_rules(rules):
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def check_alert_names(rules, series, report):
    out = {}
    for r in alert_rules(rules):
        out[r["alert"]] = check_names(r["expr"], series, f"alert {r['alert']}")
    report(f"alerts: every metric of the {len(out)} alerts is exported by the code, every label one it has")
    return out


def promtool_test(promtool, root, rules_text=None):
    """promtool test rules on the alert tests, against rules_text instead of the rule
    file when given."""
    tests = os.path.join(root, ALERT_TESTS)
    if rules_text is None:
        return subprocess.run([promtool, "test", "rules", tests], capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as d:
        t = yaml.safe_load(open(tests))
        t["rule_files"] = ["rules.yaml"]
        with open(os.path.join(d, "rules.yaml"), "w") as f:
            f.write(rules_text)
        with open(os.path.join(d, "test.yaml"), "w") as f:
            yaml.safe_dump(t, f)
        return subprocess.run([promtool, "test", "rules", os.path.join(d, "test.yaml")], capture_output=True, text=True)


def check_alerts(promtool, root, report):
    p = subprocess.run([promtool, "check", "rules", os.path.join(root, RULES)], capture_output=True, text=True)
    if p.returncode != 0:
        raise CheckError(f"promtool check rules {RULES}:\n{p.stdout}{p.stderr}")
    report(f"promtool check rules: {p.stdout.strip().splitlines()[-1].strip()}")
    p = promtool_test(promtool, root)
    if p.returncode != 0:
        raise CheckError(f"promtool test rules {ALERT_TESTS}:\n{p.stdout}{p.stderr}")
    rules = yaml.safe_load(open(os.path.join(root, RULES)))
    names = [r["alert"] for r in alert_rules(rules)]
    tests = yaml.safe_load(open(os.path.join(root, ALERT_TESTS)))
    fires, silent = set(), set()
    for t in tests["tests"]:
        for a in t.get("alert_rule_test", []):
            (fires if a.get("exp_alerts") else silent).add(a["alertname"])
    missing = [n for n in names if n not in fires or n not in silent]
    if missing:
        raise CheckError(f"{ALERT_TESTS}: no firing and silent case for {missing}")
    report(f"promtool test rules: {len(names)} alerts, each with a firing and a silent case, pass")
    # Each alert made to fire always, and never: the tests must see both.
    for n in names:
        for mutant, what in (("vector(1)", "always firing"), ("vector(1) < 0", "never firing")):
            r = copy.deepcopy(rules)
            for rule in alert_rules(r):
                if rule["alert"] == n:
                    rule["expr"] = mutant
            p = promtool_test(promtool, root, yaml.safe_dump(r))
            if p.returncode == 0 or f"alertname: {n}," not in p.stdout + p.stderr:
                raise CheckError(f"{ALERT_TESTS}: {n} made {what} still passes its tests")
    report(f"alert tests reject every alert made always firing and never firing ({2 * len(names)} mutants)")
    return rules


# --------------------------------------------------------------------------------------
# Generated file, links, monitors, scrape config, docs

PR_HEADER = """\
# GENERATED by hack/monitoring-check.sh --update from
# deploy/helm/fgpu/files/monitoring/prometheus-rules.rules.yaml: edit that file, not this one.
# fgpu's alerts as a PrometheusRule, for a cluster with the Prometheus Operator and fgpu
# installed without the chart (the chart has monitoring.prometheusRule.enabled):
#   kubectl apply -f deploy/monitoring/prometheus-rules.yaml
# Your Prometheus must select it: its ruleSelector (often a `release` label: add it below)
# and ruleNamespaceSelector.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: fgpu
  namespace: fgpu-system
  labels:
    app.kubernetes.io/name: fgpu
spec:
"""


def prometheus_rule(rules_text):
    return PR_HEADER + "".join(f"  {line}" if line.strip() else line for line in rules_text.splitlines(True))


def check_generated(root, report, rules_text=None):
    rules_text = rules_text if rules_text is not None else open(os.path.join(root, RULES)).read()
    want = prometheus_rule(rules_text)
    path = os.path.join(root, PROMETHEUS_RULE)
    have = open(path).read() if os.path.exists(path) else ""
    if have != want:
        raise CheckError(f"{PROMETHEUS_RULE} is not the rule file wrapped in a PrometheusRule: run hack/monitoring-check.sh --update")
    doc = yaml.safe_load(have)
    if doc["spec"] != yaml.safe_load(rules_text):
        raise CheckError(f"{PROMETHEUS_RULE}: spec differs from {RULES}")
    report(f"{PROMETHEUS_RULE}: generated from {RULES}, up to date")


def check_links(root, report):
    for link, target in LINKS.items():
        p = os.path.join(root, link)
        if not os.path.islink(p) or os.path.realpath(p) != os.path.realpath(os.path.join(root, target)):
            raise CheckError(f"{link} must be a symlink to {target} (one source for the chart and deploy/)")
    report(f"deploy/monitoring links to the chart's files: {', '.join(sorted(LINKS))}")


def _docs(path, kind=None):
    return [d for d in yaml.safe_load_all(open(path)) if d and (kind is None or d["kind"] == kind)]


def check_monitors(root, report):
    ds = _docs(os.path.join(root, "deploy/kubelet-plugin/daemonset.yaml"), "DaemonSet")[0]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    pod_ports = {p.get("name") for c in ds["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    pm = _docs(os.path.join(root, MON, "podmonitor.yaml"), "PodMonitor")[0]
    sel = pm["spec"]["selector"]["matchLabels"]
    ep = pm["spec"]["podMetricsEndpoints"][0]
    if not sel.items() <= pod_labels.items() or ep["port"] not in pod_ports or ep.get("honorLabels") is not True:
        raise CheckError(f"podmonitor.yaml: selector {sel} / port {ep['port']} / honorLabels do not fit the plugin's pods {pod_labels} {pod_ports}")
    if {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} not in ep.get("relabelings", []):
        raise CheckError("podmonitor.yaml: no relabeling of __meta_kubernetes_pod_node_name to node")
    ctl = _docs(os.path.join(root, "deploy/controller/controller.yaml"))
    svc = [d for d in ctl if d["kind"] == "Service"][0]
    sm = _docs(os.path.join(root, MON, "servicemonitor.yaml"), "ServiceMonitor")[0]
    sel = sm["spec"]["selector"]["matchLabels"]
    ep = sm["spec"]["endpoints"][0]
    svc_labels = svc["metadata"].get("labels", {})
    if not sel.items() <= svc_labels.items() or ep["port"] not in {p["name"] for p in svc["spec"]["ports"]}:
        raise CheckError(f"servicemonitor.yaml: selector {sel} / port {ep['port']} do not fit the Service {svc_labels} {svc['spec']['ports']}")
    for m in (pm, sm):
        if m["metadata"]["namespace"] not in m["spec"]["namespaceSelector"]["matchNames"]:
            raise CheckError(f"{m['kind']}: namespaceSelector {m['spec']['namespaceSelector']} misses its namespace")
    report("podmonitor.yaml and servicemonitor.yaml select deploy/'s plugin pods and controller Service, port metrics")


def check_scrape_config(promtool, root, report):
    cfg = yaml.safe_load(open(os.path.join(root, MON, "prometheus-scrape.yaml")))
    jobs = [j["job_name"] for j in cfg["scrape_configs"]]
    if not any("fgpu-kubelet-plugin" in j for j in jobs) or not any("fgpu-controller" in j for j in jobs):
        raise CheckError(f"prometheus-scrape.yaml: job names {jobs} do not match the alerts' up{{job=~...}}")
    for j in cfg["scrape_configs"]:
        if "kubernetes_sd_configs" not in j:
            raise CheckError(f"prometheus-scrape.yaml: job {j['job_name']} has no kubernetes_sd_configs")
        j.pop("kubernetes_sd_configs")
        j["static_configs"] = [{"targets": ["127.0.0.1:1"]}]
    with tempfile.TemporaryDirectory() as d:
        for r in cfg.get("rule_files", []):
            with open(os.path.join(d, r), "w") as out:
                out.write(open(os.path.join(root, MON, r)).read())
        f = os.path.join(d, "prometheus.yaml")
        with open(f, "w") as out:
            yaml.safe_dump(cfg, out)
        p = subprocess.run([promtool, "check", "config", f], capture_output=True, text=True)
    if p.returncode != 0:
        raise CheckError(f"promtool check config prometheus-scrape.yaml:\n{p.stdout}{p.stderr}")
    report(f"prometheus-scrape.yaml: promtool check config passes (jobs {', '.join(jobs)}; Kubernetes discovery not checked)")


def md_table(text, heading):
    """The body rows (lists of cells) of the first table under '### heading'."""
    m = re.search(rf"^### {re.escape(heading)}\n(.*?)(?=^#|\Z)", text, re.M | re.S)
    if not m:
        raise CheckError(f"{DOC}: no section '### {heading}'")
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in m.group(1).splitlines() if line.startswith("|")]
    if len(rows) < 3:
        raise CheckError(f"{DOC} '### {heading}': no table")
    return rows[2:]


def ticked(cell):
    return set(re.findall(r"`([^`]+)`", cell))


def check_doc(root, panels, alerts, fams, report, text=None):
    text = text if text is not None else open(os.path.join(root, DOC)).read()
    for heading, want, width in (("Dashboard panels", panels, 2), ("Alerts", {(k,): v for k, v in alerts.items()}, 1)):
        have = {tuple(c.strip("`") for c in r[:width]): ticked(r[-1]) for r in md_table(text, heading)}
        if have != want:
            lines = [f"  | {' | '.join(k)} | {', '.join(f'`{f}`' for f in sorted(v))} |" for k, v in sorted(want.items())
                     if have.get(k) != v]
            extra = [f"  {' | '.join(k)}" for k in have if k not in want]
            raise CheckError(f"{DOC} '### {heading}' does not list what the artefacts use. Rows that should read:\n"
                             + "\n".join(lines) + ("\n  rows to drop:\n" + "\n".join(extra) if extra else ""))
    want = {exposed(f, kind): (kind, labels, exact) for f, (kind, labels, exact) in fams.items()}
    have = {}
    for r in md_table(text, "Metric families"):
        names = ticked(r[0])
        if len(names) != 1 or len(r) < 3:
            raise CheckError(f"{DOC} '### Metric families': row {r}: want | `family` | kind | `labels` | ...")
        have[names.pop()] = (r[1], ticked(r[2]))
    for f, (kind, labels, exact) in sorted(want.items()):
        if f not in have:
            raise CheckError(f"{DOC} '### Metric families': no row for {f} ({kind}, labels {sorted(labels)})")
        dk, dl = have[f]
        if dk != kind or (dl != labels if exact else not dl <= labels):
            raise CheckError(f"{DOC} '### Metric families': {f} is a {kind} with labels {sorted(labels)}"
                             f"{'' if exact else ' (at most)'}, the table says {dk} {sorted(dl)}")
    extra = sorted(set(have) - set(want))
    if extra:
        raise CheckError(f"{DOC} '### Metric families' lists families the code does not export: {extra}")
    report(f"{DOC}: the tables of families ({len(want)}), panels and alerts match the code and the artefacts")


# --------------------------------------------------------------------------------------


def run_checks(root, promtool, report, sources=None, dash=None, doc=None, full=True):
    """Every check; full=False (the self-test's mutants of the source, the dashboard and the
    docs) leaves out promtool's runs on the rules and the scrape config, which they do not
    change."""
    fams, prefixes = exported(sources if sources is not None else rust_sources(root))
    series = series_names(fams)
    report(f"the code exports {len(fams)} families: "
           + ", ".join(f"{p}_* {sum(f.startswith(p + '_') for f in fams)}" for p in prefixes))
    check_links(root, report)
    if full:
        rules = check_alerts(promtool, root, report)
    else:
        rules = yaml.safe_load(open(os.path.join(root, RULES)))
    alerts = check_alert_names(rules, series, report)
    check_generated(root, report)
    dash = dash if dash is not None else json.load(open(os.path.join(root, DASHBOARD)))
    panels = check_dashboard(dash, series, promtool, report)
    check_dashboard_data(dash, fams, promtool, report)
    check_doc(root, panels, alerts, fams, report, doc)
    used = {f for fs in list(panels.values()) + list(alerts.values()) for f in fs}
    unused = sorted({exposed(f, kind) for f, (kind, _, _) in fams.items()} - used)
    if unused:
        print(f"note: exported but on no panel and in no alert: {', '.join(unused)}")
    check_monitors(root, report)
    if full:
        check_scrape_config(promtool, root, report)


def self_test(root, promtool):
    """Each mutant must make the named check fail."""
    quiet = lambda _: None  # noqa: E731
    sources = rust_sources(root)
    dash = json.load(open(os.path.join(root, DASHBOARD)))
    doc = open(os.path.join(root, DOC)).read()

    def dash_with(old, new):
        """The dashboard with old replaced by new in the first query holding it."""
        d = copy.deepcopy(dash)
        for p in all_panels(d):
            for t in p.get("targets", []):
                if old in t.get("expr", ""):
                    t["expr"] = t["expr"].replace(old, new, 1)
                    return d
        raise CheckError(f"self-test: {old!r} in no query of the dashboard")

    def fixed_datasource():
        d = copy.deepcopy(dash)
        next(p for p in all_panels(d) if p.get("type") != "row")["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
        return d

    def src_with(path_part, old, new):
        s = dict(sources)
        path = [p for p in s if path_part in p and old in s[p]]
        if len(path) != 1:
            raise CheckError(f"self-test: {old!r} not in one file matching {path_part}")
        s[path[0]] = s[path[0]].replace(old, new, 1)
        return s

    cases = [
        ("a family renamed in the plugin's source",
         dict(sources=src_with("kubelet-plugin/src/metrics.rs", '"claim_used_memory_bytes"', '"claim_memory_used_bytes"')),
         "fgpu_kubelet_plugin_claim_used_memory_bytes` is not a series"),
        ("a family renamed in the controller's collector",
         dict(sources=src_with("controller/dra/src/metrics.rs", '"gpu_granted_cores"', '"gpu_cores_granted"')),
         "fgpu_controller_gpu_granted_cores` is not a series"),
        ("a counter turned into a gauge in the source (no _total)",
         dict(sources=src_with("controller/dra/src/metrics.rs", "let allocated = Counter::default();", "let allocated = Gauge::default();")),
         "fgpu_controller_claims_allocated_total` is not a series"),
        ("a label renamed in the plugin's source",
         dict(sources=src_with("kubelet-plugin/src/metrics.rs", "struct ClaimGpuLabels {\n    namespace: String,\n    claim: String,",
                               "struct ClaimGpuLabels {\n    namespace: String,\n    claim_name: String,")),
         "has no label ['claim']"),
        ("a metric in the dashboard the code does not export",
         dict(dash=dash_with("fgpu_kubelet_plugin_gpu_unattributed_processes", "fgpu_kubelet_plugin_gpu_unattributed_process_count")),
         "is not a series"),
        ("a matcher on a label the family lacks",
         dict(dash=dash_with('fgpu_kubelet_plugin_gpu_granted_cores{node=~"$node",gpu_uuid=~"$gpu"}',
                             'fgpu_kubelet_plugin_gpu_granted_cores{node=~"$node",gpu=~"$gpu"}')),
         "has no label ['gpu']"),
        ("a grouping label no family has",
         dict(dash=dash_with("sum by (read)", "sum by (reader)")),
         "by/on label ['reader']"),
        ("an expression that does not parse",
         dict(dash=dash_with("sum(max by (node, gpu_uuid, gpu_index) (fgpu_controller_gpu_memory_bytes))",
                             "sum(max by (node, gpu_uuid, gpu_index) (fgpu_controller_gpu_memory_bytes)")),
         "promtool cannot parse"),
        ("a label value the code never writes (operation=\"prepare\")",
         dict(dash=dash_with('operation="Prepare"', 'operation="prepare"')),
         "queries that return nothing"),
        ("a join whose two sides never match",
         dict(dash=dash_with("sum by (namespace, claim, gpu_uuid) (fgpu_kubelet_plugin_claim_used_memory_bytes{node=~\"$node\",namespace=~\"$namespace\",claim=~\"$claim\"}) / sum by (namespace, claim, gpu_uuid)",
                             "sum by (namespace, claim, gpu_uuid) (fgpu_kubelet_plugin_claim_used_memory_bytes{node=~\"$node\",namespace=~\"$namespace\",claim=~\"$claim\"}) / sum by (namespace, claim)")),
         "queries that return nothing"),
        ("an undefined dashboard variable",
         dict(dash=dash_with('node=~"$node"', 'node=~"$nodes"')),
         "undefined variable(s) ['nodes']"),
        ("a panel on a fixed datasource",
         dict(dash=fixed_datasource()),
         "datasource"),
        ("a doc row naming the wrong family for a panel",
         dict(doc=doc.replace("| Node | Where prepares read their claim | `fgpu_kubelet_plugin_claim_reads_total` |",
                              "| Node | Where prepares read their claim | `fgpu_kubelet_plugin_requests_total` |")),
         "'### Dashboard panels' does not list what the artefacts use"),
        ("a doc row giving a family the wrong kind",
         dict(doc=doc.replace("| `fgpu_kubelet_plugin_prepared_claims` | gauge |", "| `fgpu_kubelet_plugin_prepared_claims` | counter |")),
         "fgpu_kubelet_plugin_prepared_claims is a gauge"),
    ]
    for what, kw, expect in cases:
        try:
            run_checks(root, promtool, quiet, full=False, **kw)
        except CheckError as e:
            if expect not in str(e):
                raise CheckError(f"self-test: {what}: failed, but not with {expect!r}:\n{e}")
            print(f"ok: self-test: {what} is caught")
            continue
        raise CheckError(f"self-test: {what}: the checks passed")
    try:
        check_generated(root, quiet, open(os.path.join(root, RULES)).read().replace("for: 15m", "for: 16m"))
    except CheckError:
        print("ok: self-test: a stale generated PrometheusRule is caught")
    else:
        raise CheckError("self-test: a stale generated PrometheusRule passed")
    print(f"self-test: {len(cases) + 1} mutants caught (and each alert's two mutants in the main run)")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    root, promtool = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    try:
        if mode == "--update":
            with open(os.path.join(root, PROMETHEUS_RULE), "w") as f:
                f.write(prometheus_rule(open(os.path.join(root, RULES)).read()))
            print(f"wrote {PROMETHEUS_RULE}")
        elif mode == "--self-test":
            self_test(root, promtool)
        elif mode == "":
            n = [0]

            def report(msg):
                n[0] += 1
                print(f"ok: {msg}")
            run_checks(root, promtool, report)
            print(f"monitoring: {n[0]} checks passed")
        else:
            sys.exit(__doc__)
    except CheckError as e:
        print(f"FAIL: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
