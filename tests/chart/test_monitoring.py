"""The chart's Grafana dashboard and PrometheusRule, rendered by Helm's own
engine (see test_chart.py): opt-in, labelled for Grafana's sidecar, the
rules only where the Prometheus Operator's API is served, and both read
from the plain files in charts/patchbay/files/ (one source, byte for byte).
tests/prometheus proves the files themselves on a real Prometheus.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_python import lint
from helm_python.chart import Chart

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "patchbay"
DASHBOARD = CHART_DIR / "files" / "grafana" / "patchbay-dashboard.json"
ALERTS = CHART_DIR / "files" / "prometheus" / "patchbay-alerts.yaml"
HELPERS = "templates/_helpers.tpl"
HAS_API = '.Capabilities.APIVersions.Has "monitoring.coreos.com/v1"'
RELEASE = "patchbay"
NAMESPACE = "patchbay-system"
BOTH = {"grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}


@pytest.fixture(scope="module")
def chart() -> Iterator[Chart]:
    with Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def chart_with_prometheus_operator(tmp_path_factory) -> Iterator[Chart]:
    """The chart as rendered in a cluster that serves monitoring.coreos.com/v1.

    Offline rendering knows only Kubernetes' built-in APIs and this Helm
    binding takes no `--api-versions`, so the copy's helper that asks
    (patchbay.prometheusOperatorServed, and only it) answers true."""
    copy = tmp_path_factory.mktemp("chart") / "patchbay"
    shutil.copytree(CHART_DIR, copy)  # the crds symlink is copied as a file
    helpers = copy / HELPERS
    text = helpers.read_text()
    assert text.count(HAS_API) == 1, "the chart no longer asks for the API in one place"
    helpers.write_text(text.replace(HAS_API, "true"))
    with Chart.load(copy) as loaded:
        yield loaded


def render(chart: Chart, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    manifests = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def notes(chart: Chart, values: dict[str, Any] | None = None) -> str:
    manifests = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def dashboards(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]


def test_neither_is_installed_by_default(chart, chart_with_prometheus_operator):
    for c in (chart, chart_with_prometheus_operator):
        objects = render(c)
        assert dashboards(objects) == []
        assert of_kind(objects, "PrometheusRule") == []


def test_the_dashboard_configmap_holds_the_plain_file_and_the_sidecars_label(chart):
    [cm] = dashboards(render(chart, {"grafanaDashboard": {"enabled": True}}))
    assert cm["metadata"]["name"] == "patchbay-dashboard"
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    assert cm["data"] == {"patchbay-dashboard.json": DASHBOARD.read_text()}
    assert json.loads(cm["data"]["patchbay-dashboard.json"])["uid"] == "patchbay-gateways"
    for version in ("1.30.0", kubernetes_validate.utils.latest_version()):
        kubernetes_validate.validate(cm, version, strict=True)


def test_the_dashboards_label_namespace_and_annotations_are_configurable(chart):
    values = {
        "grafanaDashboard": {
            "enabled": True,
            "label": "example.com/dashboard",
            "labelValue": "patchbay",
            "namespace": "monitoring",
            "annotations": {"grafana_folder": "Voice"},
        }
    }
    [cm] = dashboards(render(chart, values))
    assert cm["metadata"]["labels"]["example.com/dashboard"] == "patchbay"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Voice"}
    assert "labelled example.com/dashboard=patchbay" in notes(chart, values)


def test_a_dashboard_label_that_is_not_a_label_key_is_refused(chart):
    with pytest.raises(Exception, match="label"):
        render(chart, {"grafanaDashboard": {"enabled": True, "label": "not a label"}})


def test_no_prometheusrule_without_the_prometheus_operator_and_the_notes_say_so(chart):
    assert of_kind(render(chart, BOTH), "PrometheusRule") == []
    assert "no alert rules were installed" in notes(chart, BOTH)
    assert "no alert rules were installed" not in notes(chart)


def test_the_prometheusrule_holds_the_plain_rule_file(chart_with_prometheus_operator):
    values = {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}
    [rule] = of_kind(render(chart_with_prometheus_operator, values), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "patchbay-gateway-alerts"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    # Prometheus's own templates reach the rule untouched by Helm's.
    annotations = [r["annotations"]["summary"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("{{ $labels.model }}" in a for a in annotations)
    assert "Gateway alerts: PrometheusRule patchbay-gateway-alerts" in notes(chart_with_prometheus_operator, values)


def test_chart_passes_helm_lint_in_strict_mode_with_both_on():
    report = lint(CHART_DIR, BOTH, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
