"""Engine metrics: what a side's own serving engine says on its ``/metrics``, through Prometheus.

A side names its engine (``spec.<side>.engine``: vllm, sglang, tgi) and the Prometheus labels
of its series (``metricsSelector``); each engine metric is one PromQL query per side that
tries every name the engine is known by, in order, and answers which one it found:

==========================  ==============================================================
``queue-depth``             requests waiting in the engine's queue: the mean over the window
                            of ``vllm:num_requests_waiting`` / ``sglang:num_queue_reqs``
                            (``sglang_num_queue_reqs``) / ``tgi_queue_size``, averaged over the
                            side's engines (per replica)
``kv-cache-usage``          percent of the KV cache in use: the mean of
                            ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before
                            vLLM 0.9) / ``sglang:token_usage`` (``sglang_token_usage``), which
                            the engines export as a fraction; TGI exports none
``prefix-cache-hit-rate``   percent of prompt tokens found in the prefix cache over the window:
                            ``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total``
                            (``vllm:gpu_prefix_cache_*`` before 0.9), SGLang's
                            ``sglang:cached_tokens_total`` over ``sglang:prompt_tokens_total``,
                            else the mean of its ``sglang:cache_hit_rate``; TGI exports none
==========================  ==============================================================

The query unions the forms, each tagged with a ``tinct_series`` label
(``label_replace(<form 0>, "tinct_series", "0", "", "") or ...``), so one round trip both
reads the value and says which series it came from; the first form present wins. An engine
without the metric, no series matching the selector, or a value that is not a finite number
is *inconclusive* with that reason, never a pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tinct.operator.grayrelease.prometheus import selector
from tinct.operator.grayrelease.samples import prom_number, value_of

__all__ = ["FORMS", "QUEUE_METRICS", "Form", "Reading", "engine_query", "reading_from"]

#: The label each form's result carries in the union.
FORM_LABEL = "tinct_series"


@dataclass(frozen=True)
class Form:
    """One way an engine exports a metric: the series shown in status, and its PromQL."""

    series: str
    #: PromQL with ``{sel}`` (the side's label matchers) and ``{w}`` (the window) to fill in.
    promql: str


def _mean(name: str, scale: str = "") -> Form:
    return Form(name, f"{scale}avg(avg_over_time({name}{{{{{{sel}}}}}}[{{w}}]))")


def _ratio(hits: str, total: str, shown: str) -> Form:
    return Form(
        shown,
        f"100 * sum(increase({hits}{{{{{{sel}}}}}}[{{w}}])) / sum(increase({total}{{{{{{sel}}}}}}[{{w}}]))",
    )


#: Queue depth of each engine (requests waiting, not yet running), in every name it has been
#: exported under, the first found winning: the analysis' queue-depth and KEDA's default
#: scaling query (:func:`tinct.operator.grayrelease.scaling.side_query`) read the same table.
QUEUE_METRICS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm:num_requests_waiting",),
    "sglang": ("sglang:num_queue_reqs", "sglang_num_queue_reqs"),
    "tgi": ("tgi_queue_size",),
}

#: (metric, engine) -> the forms tried, in order; an absent key: the engine has no such metric.
FORMS: dict[tuple[str, str], tuple[Form, ...]] = {
    **{("queue-depth", engine): tuple(_mean(n) for n in names) for engine, names in QUEUE_METRICS.items()},
    ("kv-cache-usage", "vllm"): (
        _mean("vllm:kv_cache_usage_perc", "100 * "),
        _mean("vllm:gpu_cache_usage_perc", "100 * "),
    ),
    ("kv-cache-usage", "sglang"): (
        _mean("sglang:token_usage", "100 * "),
        _mean("sglang_token_usage", "100 * "),
    ),
    ("prefix-cache-hit-rate", "vllm"): (
        _ratio(
            "vllm:prefix_cache_hits_total",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total",
        ),
        _ratio(
            "vllm:gpu_prefix_cache_hits_total",
            "vllm:gpu_prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_hits_total / vllm:gpu_prefix_cache_queries_total",
        ),
    ),
    ("prefix-cache-hit-rate", "sglang"): (
        _ratio(
            "sglang:cached_tokens_total",
            "sglang:prompt_tokens_total",
            "sglang:cached_tokens_total / sglang:prompt_tokens_total",
        ),
        _ratio(
            "sglang_cached_tokens_total",
            "sglang_prompt_tokens_total",
            "sglang_cached_tokens_total / sglang_prompt_tokens_total",
        ),
        _mean("sglang:cache_hit_rate", "100 * "),
        _mean("sglang_cache_hit_rate", "100 * "),
    ),
}


def engine_query(metric: str, engine: str, labels: Mapping[str, str], window: str) -> str | None:
    """One PromQL query reading ``metric`` of an ``engine`` whose series carry ``labels``, over
    ``window``, every known form tagged with its index; None when the engine has no such metric.

    The label names were checked to be Prometheus label names (the CRD's rule); the values
    are escaped.
    """
    forms = FORMS.get((metric, engine))
    if not forms:
        return None
    sel = selector(**labels)
    parts = [
        f'label_replace({f.promql.format(sel=sel, w=window)}, "{FORM_LABEL}", "{i}", "", "")'
        for i, f in enumerate(forms)
    ]
    return " or ".join(parts)


@dataclass(frozen=True)
class Reading:
    """An engine metric of one side: its value and the series it came from, or why none."""

    value: float | None = None
    series: str | None = None
    why: str | None = None


def reading_from(metric: str, engine: str, labels: Mapping[str, str], rows: list[dict[str, Any]]) -> Reading:
    """The value of the first form present among the rows the :func:`engine_query` answered."""
    forms = FORMS.get((metric, engine), ())
    found: dict[int, float] = {}
    for row in rows:
        raw = row.get("metric", {}).get(FORM_LABEL)
        try:
            i = int(raw)
        except (TypeError, ValueError):
            continue
        if 0 <= i < len(forms) and i not in found:
            found[i] = value_of(row)
    if not found:
        names = ", ".join(f.series for f in forms)
        shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return Reading(why=f"no series of {names} matching {{{shown}}} in the window")
    i = min(found)
    value = found[i]
    if not math.isfinite(value):
        return Reading(
            series=forms[i].series, why=f"{forms[i].series} gave {prom_number(value)}, not a finite number"
        )
    return Reading(value=value, series=forms[i].series)


def no_metric(metric: str, engine: str) -> str:
    """Why an engine without ``metric`` gives no verdict."""
    return f"{engine} exports no {metric} metric"
