"""docs/grafana-mpswrap.json asks only for what ``mpswrap metrics`` writes: every series it
names is one of ``report.metrics.FAMILIES``, and every label it selects, groups by or shows
is one of that series' labels."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from mpswrap.report.metrics import FAMILIES
from tests.tree import REPO

DASHBOARD = REPO / "docs" / "grafana-mpswrap.json"
LABELS = {f.name: set(f.labels) for f in FAMILIES}
#: What PromQL itself names: the functions, aggregations and keywords the dashboard may use.
PROMQL = {
    *("sum", "min", "max", "avg", "count", "rate", "increase", "time", "vector", "topk"),
    *("by", "without", "or", "and", "unless", "on", "ignoring"),
}
_SELECTOR = re.compile(r"\b([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*\"")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, expression, legend) of every panel target and query variable."""
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"], target.get("legendFormat", "")
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            yield f"variable {var['name']}", var["definition"], ""


def problems(expr: str, legend: str = "") -> list[str]:
    """What in one query names a series or a label mpswrap does not write."""
    values_of = re.fullmatch(r"label_values\((.*),\s*(\w+)\s*\)", expr.strip())
    if values_of:  # a variable's values: the label must be the series'
        expr, legend = values_of[1], legend + "{{" + values_of[2] + "}}"
    bare = re.sub(r'"[^"]*"', '""', expr)  # label values are not names
    bare = re.sub(r"\[[^]]*\]|\$\w+", "", bare)  # ranges and dashboard variables
    grouping = {x.strip() for g in _GROUPING.findall(bare) for x in g.split(",") if x.strip()}
    bare = _GROUPING.sub("", bare)
    found, used = [], set()
    for name, selector in _SELECTOR.findall(bare):
        if name in PROMQL or re.fullmatch(r"[0-9.e]+", name):
            continue
        if name not in LABELS:
            found.append(f"{name}: not a series of mpswrap metrics")
            continue
        used.add(name)
        for label in _MATCHER.findall(selector):
            if label not in LABELS[name]:
                found.append(f"{name}: no label {label}")
    known = set().union(*(LABELS[n] for n in used)) if used else set()
    found += [f"no series has label {x}" for x in sorted(grouping - known)]
    shown = set(_LEGEND.findall(legend))
    found += [f"legend shows {x}, which no series has" for x in sorted(shown - known)]
    if not used:
        found.append("names no series of mpswrap metrics")
    return found


def test_every_query_of_the_dashboard_asks_for_what_mpswrap_writes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = list(_queries(dashboard))
    assert len(queries) >= 10, queries
    found = [
        f"{where}: {expr}: {p}" for where, expr, legend in queries for p in problems(expr, legend)
    ]
    assert found == []
    asked = {n for _, expr, _ in queries for n in LABELS if re.search(rf"\b{n}\b", expr)}
    assert {"mpswrap_clients", "mpswrap_programs_ended_total"} <= asked


def test_the_check_itself_finds_a_wrong_name_label_or_legend() -> None:
    assert problems('sum by (job_id) (mpswrap_clients{node=~"$node"})') == []
    assert problems('mpswrap_client_info{command=~".*"}') == []
    assert problems("sum(mpswrap_server_clients)") == [
        "mpswrap_server_clients: not a series of mpswrap metrics",
        "names no series of mpswrap metrics",
    ]
    assert problems('mpswrap_clients{pid="1"}') == ["mpswrap_clients: no label pid"]
    assert problems("sum by (pid) (mpswrap_clients)") == ["no series has label pid"]
    assert problems("mpswrap_jobs", "{{job_id}}") == ["legend shows job_id, which no series has"]
    assert problems("label_values(mpswrap_jobs, job_id)") == [
        "legend shows job_id, which no series has"
    ]
    assert problems("time() - process_start_time_seconds") == [
        "process_start_time_seconds: not a series of mpswrap metrics",
        "names no series of mpswrap metrics",
    ]
