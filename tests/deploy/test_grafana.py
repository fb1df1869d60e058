"""deploy/grafana/tritongate.json: every query names metrics (and labels) that the edge and the services
export, so that no panel stays empty because of a typo or a renamed metric."""

from __future__ import annotations

import json
import re
from types import ModuleType

import pytest
from prometheus_client.metrics import MetricWrapperBase

import edge.telemetry
import services.common.metrics
from tritongate.settings import DEPLOY_DIR

DASHBOARD = DEPLOY_DIR / "grafana" / "tritongate.json"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count")}
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")


def exported(*modules: ModuleType) -> dict[str, set[str]]:
    """Each series name the modules' metrics export → its labels."""
    series: dict[str, set[str]] = {}
    for module in modules:
        for metric in vars(module).values():
            if isinstance(metric, MetricWrapperBase):
                for suffix in SUFFIXES[metric._type]:
                    labels = set(metric._labelnames) | ({"le"} if suffix == "_bucket" else set())
                    series[metric._name + suffix] = labels
    return series


def references(expr: str) -> tuple[set[str], set[str]]:
    """(series names, label names) a PromQL expression uses."""
    labels = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
    rest = GROUPING.sub(" ", expr)
    for matchers in MATCHERS.findall(rest):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    rest = re.sub(r"\[[^\]]*\]", " ", MATCHERS.sub(" ", rest))
    rest = re.sub(r'"[^"]*"', " ", rest)
    names = {name for name in re.findall(r"\b([a-zA-Z_:][\w:]*)\b(?!\s*\()", rest)}
    return names, labels


def queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


SERIES = exported(edge.telemetry, services.common.metrics)


def test_the_reference_reader_sees_what_a_query_uses() -> None:
    names, labels = references('sum by (le, route) (rate(http_request_duration_seconds_bucket{status=~"5.."}[5m]))')
    assert names == {"http_request_duration_seconds_bucket"} and labels == {"le", "route", "status"}


def test_the_dashboard_covers_what_operators_watch() -> None:
    used = {name for _, expr in queries() for name in references(expr)[0]}
    for series in ("http_requests_total", "http_request_duration_seconds_bucket",
                   "tritongate_time_to_first_token_seconds_bucket", "tritongate_tokens_total",
                   "http_requests_in_progress", "grpc_server_in_flight",
                   "tritongate_triton_request_duration_seconds_bucket", "tritongate_batch_size_bucket",
                   "tritongate_request_stage_seconds_bucket"):
        assert series in used, series
    assert any('status="429"' in expr for _, expr in queries())


@pytest.mark.parametrize(("title", "expr"), queries())
def test_every_query_names_an_exported_metric_and_its_labels(title: str, expr: str) -> None:
    names, labels = references(expr)
    assert names, f"{title}: no metric in {expr}"
    for name in names:
        assert name in SERIES, f"{title}: {name} is not exported"
        # "status" is http_requests_total's; a label of another metric in the same query is checked there.
        assert labels <= set().union(*(SERIES[n] for n in names)), f"{title}: {labels} on {names}"
