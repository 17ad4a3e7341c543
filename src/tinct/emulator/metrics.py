"""``/metrics`` of the emulated engine: its state under the names the real engine uses.

The families are built from :class:`~tinct.emulator.engine.EngineState` at each scrape, with
the names of the engine the behaviour names at that moment (:mod:`tinct.emulator.names`),
so changing the engine or its alternate names at runtime changes the next scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tinct.emulator.engine import EngineState
from tinct.emulator.lora import lora_info
from tinct.emulator.names import LORA_INFO, names

__all__ = ["exposition"]

_HELP = {
    "running": "Requests being generated (emulated).",
    "waiting": "Requests waiting for a batch slot (emulated).",
    "kv_usage": "KV-cache usage, 1 means 100 percent (emulated).",
    "cache_hit_rate": "Prefix cache hit rate (emulated).",
    "used_tokens": "Tokens held in the KV cache (emulated).",
    "prefix_queries": "Prefix cache queries, in prompt tokens (emulated).",
    "prefix_hits": "Prefix cache hits, in prompt tokens (emulated).",
    "prompt_tokens": "Prompt tokens processed (emulated).",
    "generation_tokens": "Tokens generated (emulated).",
    "cached_tokens": "Prompt tokens found in the prefix cache (emulated).",
    "requests": "Requests taken (emulated).",
    "success": "Requests finished (emulated).",
    "ttft": "Time to first token in seconds (emulated).",
    "itl": "Inter-token latency in seconds (emulated).",
    "e2e": "End-to-end request latency in seconds (emulated).",
    "queue_time": "Time waiting for a batch slot in seconds (emulated).",
    "output_tokens": "Tokens generated per request (emulated).",
    "input_tokens": "Prompt tokens per request (emulated).",
}


class _Collector(Collector):
    def __init__(self, state: EngineState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        st = self.state
        b = st.behaviour
        n = names(b.engine, b.alt_names)
        values = {"model_name": b.model, "engine": "0"}
        label_values = [values[k] for k in n.labels]
        gauges = {
            "running": float(st.running),
            "waiting": float(st.waiting),
            "kv_usage": st.kv_usage,
            "cache_hit_rate": st.cache_hit_rate,
            "used_tokens": float(st.kv_tokens),
        }
        counters = {
            "prefix_queries": float(st.prefix_queries),
            "prefix_hits": float(st.prefix_hits),
            "prompt_tokens": float(st.prompt_tokens),
            "generation_tokens": float(st.generation_tokens),
            "cached_tokens": float(st.prefix_hits),
            "requests": float(st.requests),
        }
        for role, name in n.gauges.items():
            g = GaugeMetricFamily(name, _HELP[role], labels=n.labels)
            g.add_metric(label_values, gauges[role])
            yield g
        for role, name in n.counters.items():
            if role == "success":
                labels = (*n.labels, "finished_reason") if n.labels else ()
                c = CounterMetricFamily(name, _HELP[role], labels=labels)
                if labels:
                    for reason, count in sorted(st.finished.items()):
                        c.add_metric([*label_values, reason], float(count))
                else:
                    c.add_metric([], float(sum(st.finished.values())))
                yield c
                continue
            c = CounterMetricFamily(name, _HELP[role], labels=n.labels)
            c.add_metric(label_values, counters[role])
            yield c
        for role, name in n.histograms.items():
            h = st.histograms[role]
            fam = HistogramMetricFamily(name, _HELP[role], labels=n.labels)
            fam.add_metric(label_values, h.buckets(), h.total)
            yield fam
        if b.engine == "vllm" and b.runtime_lora:
            info, value = lora_info(st)
            g = GaugeMetricFamily(
                LORA_INFO, "Running and waiting LoRA adapters (emulated).", labels=list(info)
            )
            g.add_metric(list(info.values()), value)
            yield g


def exposition(state: EngineState) -> bytes:
    """Prometheus text of ``state``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(state))
    return generate_latest(registry)
