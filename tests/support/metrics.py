"""Reading a Prometheus scrape in the tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def total(metrics: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` in the scrape `metrics` that carry `labels`."""
    return sum(sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))
