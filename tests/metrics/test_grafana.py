"""The Grafana dashboard in docs/ queries only what the exporter really exposes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from benchmarks.scrape import SyntheticNode
from memdoc.metrics.families import MemdocCollector
from memdoc.metrics.identity import JobIdentity
from memdoc.metrics.sources import TraceFileSource
from tests.conftest import FIXTURES, REPO

DASHBOARD = REPO / "docs" / "grafana" / "memdoc.json"
METRIC = re.compile(r"\bmemdoc_[a-z_]+\b")
LABEL_MATCHER = re.compile(r"\b([a-z_]+)\s*=~?\s*\"")
BY_CLAUSE = re.compile(r"\bby\s*\(([^)]*)\)")


def _exposed(tmp_path: Path) -> dict[str, set[str]]:
    """Every sample name the exporter writes, with its labels: for a synthetic 8-GPU node
    with 64 processes (every family but the finding) and a recorded run with a finding."""
    path = tmp_path / "node.memdoc"
    node = SyntheticNode(path, seed=1)
    node.write(seconds=5.0)
    node.writer.close()
    found = tmp_path / "found.memdoc"
    shutil.copy(FIXTURES / "rules" / "fragmentation" / "hit-recorded-cache.memdoc", found)
    names: dict[str, set[str]] = {}
    for trace in (path, found):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(MemdocCollector(TraceFileSource(trace), JobIdentity("h", job="j")))
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                names.setdefault(sample.name, set()).update(sample.labels)
    return names


def _panels(dashboard: dict[str, object]) -> list[dict[str, object]]:
    panels = dashboard["panels"]
    assert isinstance(panels, list)
    return panels


def _queries(dashboard: dict[str, object]) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]  # type: ignore[attr-defined]
    templating = dashboard["templating"]
    assert isinstance(templating, dict)
    exprs += [v["definition"] for v in templating["list"] if v.get("type") == "query"]
    return exprs


def test_every_query_names_metrics_and_labels_the_exporter_writes(tmp_path: Path) -> None:
    exposed = _exposed(tmp_path)
    dashboard = json.loads(DASHBOARD.read_text())

    queries = _queries(dashboard)
    assert queries
    for query in queries:
        names = METRIC.findall(query)
        assert names, query
        for name in names:
            assert name in exposed, (name, sorted(exposed))
            labels = set(LABEL_MATCHER.findall(query))
            for group in BY_CLAUSE.findall(query):
                labels |= {label.strip() for label in group.split(",")}
            labels -= {"le"}
            assert labels <= exposed[name] | {"instance"}, (query, labels - exposed[name])


def test_the_dashboard_has_the_panels_it_promises() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = [p["title"] for p in _panels(dashboard)]

    for wanted in (
        "GPU $device ledger on $host",
        "GPU memory per process (driver)",
        "Host RSS vs limit",
        "Step rate",
        "OOMs",
        "Top finding per node",
    ):
        assert wanted in titles
    ledger = next(p for p in _panels(dashboard) if p["title"] == "GPU $device ledger on $host")
    assert ledger["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"  # type: ignore[index]
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
