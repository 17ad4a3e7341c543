"""The metric names and buckets each emulated engine exports, as the engines name them.

Checked against the engines' own sources:

- **vLLM**, ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``, labels ``model_name`` and
  ``engine``): gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` ("KV-cache usage. 1 means 100 percent usage."); counters
  ``vllm:prefix_cache_queries``, ``vllm:prefix_cache_hits`` (in tokens),
  ``vllm:prompt_tokens``, ``vllm:generation_tokens``, ``vllm:request_success``
  (``finished_reason``), which ``prometheus_client`` exports with ``_total``; histograms
  ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
  ``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds`` with the buckets
  below. The same file marks the names before 0.9 deprecated: ``vllm:gpu_cache_usage_perc``
  (renamed ``kv_cache_usage_perc``), ``vllm:gpu_prefix_cache_queries`` / ``_hits`` (renamed
  ``prefix_cache_*``), and ``vllm:time_per_output_token_seconds`` ("DEPRECATED: Use
  vllm:inter_token_latency_seconds instead"). With LoRA enabled it also exports the gauge
  ``vllm:lora_requests_info`` (labels ``max_lora``, ``running_lora_adapters``,
  ``waiting_lora_adapters``: the adapters with requests running and waiting, comma-separated;
  the value is a timestamp): :data:`LORA_INFO`.
- **SGLang**, ``docs/references/production_metrics.md`` (label ``model_name``): gauges
  ``sglang:num_running_reqs``, ``sglang:num_queue_reqs`` ("The number of requests in the
  waiting queue"), ``sglang:token_usage``, ``sglang:cache_hit_rate``,
  ``sglang:num_used_tokens``, ``sglang:gen_throughput``; counters
  ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``; histograms
  ``sglang:time_to_first_token_seconds``, ``sglang:time_per_output_token_seconds``,
  ``sglang:e2e_request_latency_seconds``. Deployments also export these with ``_`` for
  ``:`` (``sglang_num_queue_reqs``, ``sglang_token_usage``): the alternate names here.
- **TGI**, ``docs/source/reference/metrics.md`` (no labels): gauges ``tgi_queue_size``,
  ``tgi_batch_current_size``; counters ``tgi_request_count``, ``tgi_request_success``;
  histograms ``tgi_request_duration``, ``tgi_request_queue_duration``,
  ``tgi_request_mean_time_per_token_duration``, ``tgi_request_generated_tokens``,
  ``tgi_request_input_length``. TGI exports no KV-cache or prefix-cache figure.

Roles (the keys of :class:`Names`) are what the emulator measures; an engine without a role
leaves it out, as the real one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BUCKETS", "LORA_INFO", "Names", "names"]

#: vLLM's gauge of the LoRA adapters in use (only with LoRA enabled).
LORA_INFO = "vllm:lora_requests_info"

#: vLLM's buckets (loggers.py); reused for the other engines' histograms of the same kind.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
#: Histogram role -> buckets.
BUCKETS: dict[str, tuple[float, ...]] = {
    "ttft": TTFT_BUCKETS,
    "itl": ITL_BUCKETS,
    "e2e": REQUEST_BUCKETS,
    "queue_time": REQUEST_BUCKETS,
    "output_tokens": TOKEN_BUCKETS,
    "input_tokens": TOKEN_BUCKETS,
}


@dataclass(frozen=True)
class Names:
    """One engine's export: role -> metric name, and the labels every series carries."""

    labels: tuple[str, ...]
    gauges: dict[str, str] = field(default_factory=dict)
    counters: dict[str, str] = field(default_factory=dict)  # without the ``_total``
    histograms: dict[str, str] = field(default_factory=dict)


def _vllm(alt: bool) -> Names:
    return Names(
        labels=("model_name", "engine"),
        gauges={
            "running": "vllm:num_requests_running",
            "waiting": "vllm:num_requests_waiting",
            "kv_usage": "vllm:gpu_cache_usage_perc" if alt else "vllm:kv_cache_usage_perc",
        },
        counters={
            "prefix_queries": "vllm:gpu_prefix_cache_queries" if alt else "vllm:prefix_cache_queries",
            "prefix_hits": "vllm:gpu_prefix_cache_hits" if alt else "vllm:prefix_cache_hits",
            "prompt_tokens": "vllm:prompt_tokens",
            "generation_tokens": "vllm:generation_tokens",
            "success": "vllm:request_success",
        },
        histograms={
            "ttft": "vllm:time_to_first_token_seconds",
            "itl": "vllm:time_per_output_token_seconds" if alt else "vllm:inter_token_latency_seconds",
            "e2e": "vllm:e2e_request_latency_seconds",
            "queue_time": "vllm:request_queue_time_seconds",
            "output_tokens": "vllm:request_generation_tokens",
            "input_tokens": "vllm:request_prompt_tokens",
        },
    )


def _sglang(alt: bool) -> Names:
    p = "sglang_" if alt else "sglang:"
    return Names(
        labels=("model_name",),
        gauges={
            "running": p + "num_running_reqs",
            "waiting": p + "num_queue_reqs",
            "kv_usage": p + "token_usage",
            "cache_hit_rate": p + "cache_hit_rate",
            "used_tokens": p + "num_used_tokens",
        },
        counters={
            "prompt_tokens": p + "prompt_tokens",
            "generation_tokens": p + "generation_tokens",
            "cached_tokens": p + "cached_tokens",
            "requests": p + "num_requests",
        },
        histograms={
            "ttft": p + "time_to_first_token_seconds",
            "itl": p + "time_per_output_token_seconds",
            "e2e": p + "e2e_request_latency_seconds",
        },
    )


def _tgi(alt: bool) -> Names:
    return Names(
        labels=(),
        gauges={"waiting": "tgi_queue_size", "running": "tgi_batch_current_size"},
        counters={"requests": "tgi_request_count", "success": "tgi_request_success"},
        histograms={
            "e2e": "tgi_request_duration",
            "queue_time": "tgi_request_queue_duration",
            "itl": "tgi_request_mean_time_per_token_duration",
            "output_tokens": "tgi_request_generated_tokens",
            "input_tokens": "tgi_request_input_length",
        },
    )


def names(engine: str, alt: bool = False) -> Names:
    """What ``engine`` (vllm, sglang, tgi) exports; ``alt``: its alternate names."""
    return {"vllm": _vllm, "sglang": _sglang, "tgi": _tgi}[engine](alt)
