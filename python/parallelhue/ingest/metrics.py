"""The server's Prometheus /metrics: evidence of speculative decoding, and server-wide deltas.

These numbers are server-wide: they count every request the server handled
during the run (other users, prefill, warm-up), not just ours. The summary
shows them apart from the run's own figures and says so.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..model.endpoint import server_root
from ..model.shapes import MetricsSnapshot

# MetricsSnapshot lives in shapes.py (the screen model reads it without httpx);
# it is re-exported here for the callers that scrape.
__all__ = [
    "MetricsSnapshot",
    "fetch_metrics",
    "metrics_url",
    "parse_metrics",
    "server_deltas",
]

# (sample name, label shown in the summary)
_DELTA_COUNTERS = (
    ("vllm:prompt_tokens_total", "prompt tokens"),
    ("vllm:generation_tokens_total", "generation tokens"),
    ("vllm:request_success_total", "finished requests"),
    ("vllm:spec_decode_num_drafts_total", "drafts"),
    ("vllm:spec_decode_num_draft_tokens_total", "draft tokens"),
    ("vllm:spec_decode_num_accepted_tokens_total", "accepted draft tokens"),
)


def metrics_url(endpoint: str) -> str:
    return server_root(endpoint) + "/metrics"


def parse_metrics(text: str) -> MetricsSnapshot | None:
    """Counters from a Prometheus text page; None when it is not one."""
    samples: dict[str, float] = {}
    families: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            families.add(family.name)
            if family.type != "counter":
                continue
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                samples[sample.name] = samples.get(sample.name, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return MetricsSnapshot(samples=samples, families=frozenset(families))


async def fetch_metrics(client: httpx.AsyncClient, endpoint: str) -> MetricsSnapshot | None:
    """Scrape /metrics; None when the server has none (that is not an error)."""
    try:
        response = await client.get(metrics_url(endpoint), timeout=10.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return parse_metrics(response.text)


def server_deltas(
    before: MetricsSnapshot | None, after: MetricsSnapshot | None
) -> list[tuple[str, float]]:
    """Counter increases over the run, server-wide; counters that reset are left out."""
    if before is None or after is None:
        return []
    deltas: list[tuple[str, float]] = []
    for name, label in _DELTA_COUNTERS:
        if name in before.samples and name in after.samples:
            delta = after.samples[name] - before.samples[name]
            if delta >= 0:
                deltas.append((label, delta))
    values = dict(deltas)
    drafted = values.get("draft tokens")
    if drafted and "accepted draft tokens" in values:
        deltas.append(("acceptance (server-wide)", values["accepted draft tokens"] / drafted))
    return deltas
