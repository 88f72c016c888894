#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Grafana dashboard (docs/grafana/airs-memd-dashboard.json) against a
metrics file a real airs-memd wrote (daemon.metrics_file):

  check_dashboard.py DASHBOARD.json METRICS.prom

  1. every metric name an expression of the dashboard queries (panels'
     targets and template variables; airs_* identifiers) is a sample name
     in the file;
  2. every label matcher on such a metric (name{label="value"} or =~) names
     a label the daemon writes on it, and an exact value it writes;
  3. every `by (...)` label is one of the daemon's labels on the metrics
     the expression uses (or instance/job, added by Prometheus);
  4. every metric family the daemon writes is on the dashboard (a new
     metric gets a panel, or this fails).
Exit status: 0 all good, 1 otherwise (each problem printed).
"""
import json
import re
import sys

dash_path, prom_path = sys.argv[1], sys.argv[2]
failures = []
SCRAPE_LABELS = {"instance", "job"}

# Samples: name{labels} value
samples = {}   # name -> {label: set(values)}
families = set()
for line in open(prom_path, encoding="utf-8"):
    line = line.strip()
    if line.startswith("# TYPE "):
        families.add(line.split()[2])
        continue
    if not line or line.startswith("#"):
        continue
    m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+\S+$', line)
    if not m:
        failures.append(f"unparsable metrics line: {line}")
        continue
    labels = samples.setdefault(m.group(1), {})
    for k, v in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""):
        labels.setdefault(k, set()).add(v)

dash = json.load(open(dash_path, encoding="utf-8"))
exprs = []
def walk(panels):
    for p in panels:
        for t in p.get("targets", []):
            if "expr" in t:
                exprs.append((p.get("title", "?"), t["expr"]))
        walk(p.get("panels", []))
walk(dash.get("panels", []))
for v in dash.get("templating", {}).get("list", []):
    q = v.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    if q:
        exprs.append(("variable " + v.get("name", "?"), q))
if not exprs:
    failures.append("the dashboard has no expressions")

used = set()
for title, e in exprs:
    names = set(re.findall(r'\b(airs_[a-zA-Z0-9_:]*)', e))
    if not names:
        failures.append(f"[{title}] queries no airs_* metric: {e}")
    for n in names:
        used.add(n)
        if n not in samples:
            failures.append(f"[{title}] {n} is not written by the daemon")
    for n, body in re.findall(r'\b(airs_[a-zA-Z0-9_:]*)\{([^}]*)\}', e):
        for k, op, v in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"', body):
            if k in SCRAPE_LABELS:
                continue
            have = samples.get(n, {})
            if k not in have:
                failures.append(f"[{title}] {n} has no label {k} (it has: {sorted(have)})")
            elif op == "=" and v not in have[k]:
                failures.append(f"[{title}] {n}{{{k}=\"{v}\"}}: the daemon writes {k} values {sorted(have[k])}")
    labels_here = set(SCRAPE_LABELS)
    for n in names:
        labels_here |= set(samples.get(n, {}))
    for group in re.findall(r'\b(?:by|without)\s*\(([^)]*)\)', e):
        for k in [x.strip() for x in group.split(",") if x.strip()]:
            if k not in labels_here:
                failures.append(f"[{title}] groups by {k}, a label none of {sorted(names)} has")

for fam in sorted(families):
    members = {fam, fam + "_bucket", fam + "_sum", fam + "_count"}
    if not (members & used):
        failures.append(f"the daemon writes {fam}, and no panel shows it")

for f in failures:
    print("FAIL: " + f)
print(f"{len(exprs)} expressions, {len(used)} metric names checked against {len(samples)} sample names "
      f"({len(families)} families) from {prom_path}")
sys.exit(1 if failures else 0)
