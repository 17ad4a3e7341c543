"""A LoRA adapter candidate on stable's pods: what must be loaded where, and what holds; pure.

An adapter candidate (``spec.candidate.adapter``) has no backend of its own: the adapter is
loaded into every ready pod behind stable's Service through the engine's runtime API
(stable's ``engine``: vLLM or SGLang), under the served name its ModelVersion recorded
(``status.adapter.servedName``: distinct per adapter content). The acting side
(:mod:`~tinct.operator.grayrelease.adapters`) observes each pod (:class:`PodSeen`: its
``/v1/models``, and the engine's answer to the last load) and this module says:

- what the release records (:func:`record`: ``status.adapter``, the addresses of the pods
  holding it, which the routing table sends the candidate's share to, and no other);
- which pods to load it into (:func:`to_load`) or take it off (:func:`to_unload`), and when
  (:func:`keeps_adapter`, :func:`drained`);
- why the candidate cannot serve (:func:`problem`): an engine without runtime loading, a
  load the engine refused, no pod holding it yet. That candidate problem holds the release
  at weight 0 (:mod:`~tinct.operator.grayrelease.decide`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tinct.api.v1alpha1.grayrelease import (
    ADAPTER_ADDRESSES_LIMIT,
    ADAPTER_PODS_LIMIT,
    AdapterCandidate,
    AdapterPod,
    AdapterPodState,
    AdapterRelease,
    GrayReleaseSpec,
)
from tinct.operator.grayrelease.preconditions import Problem
from tinct.text import clip

__all__ = [
    "DRAIN",
    "LOADING_ENGINES",
    "PodSeen",
    "drained",
    "engine_path",
    "keeps_adapter",
    "problem",
    "record",
    "to_load",
    "to_unload",
]

#: The engines that load LoRA adapters at run time, as tinct asks them to.
LOADING_ENGINES = ("vllm", "sglang")
#: How long after the candidate lost its traffic the adapter stays loaded, for the requests
#: in flight on it to finish.
DRAIN = timedelta(seconds=30)
_REASON_CHARS = 1024


@dataclass(frozen=True)
class PodSeen:
    """One of stable's pods as the round found it."""

    name: str
    #: ``status.podIP``; None before the pod has one.
    address: str | None
    ready: bool
    #: The model names its engine's ``/v1/models`` lists; None: it did not answer.
    served: frozenset[str] | None
    #: The engine's refusal of the last load of this adapter on this pod (None: not refused).
    refused: str | None = None


def engine_path(adapter: AdapterCandidate, directory: str) -> str:
    """What the engines are told to load: the adapter's ``directory`` as verified, or, under
    ``uriPrefix``, the same place below ``mountPath`` on the engine pods."""
    prefix, mount = adapter.uri_prefix, adapter.mount_path
    if prefix is None or mount is None or not directory.startswith(prefix):
        return directory
    return posixpath.join(mount, directory[len(prefix) :].lstrip("/"))


def _serving(pods: Sequence[PodSeen]) -> list[PodSeen]:
    return [p for p in pods if p.ready and p.address]


def _state(pod: PodSeen, served_name: str, wanted: bool) -> AdapterPodState:
    if pod.served is not None and served_name in pod.served:
        return "Loaded"
    if pod.refused is not None:
        return "Failed"
    return "Loading" if wanted else "Unloaded"


def record(
    model_version: str,
    served_name: str | None,
    digest: str | None,
    path: str | None,
    pods: Sequence[PodSeen],
    wanted: bool = True,
    withdrawn_at: datetime | None = None,
    port: int | None = None,
) -> AdapterRelease:
    """``status.adapter``: on how many of stable's ready pods the adapter is, and which.

    Only a pod whose engine lists the served name counts as holding it; the listed pods
    are the ones not holding it first (bounded), the addresses those holding it (sorted).
    """
    ready = _serving(pods)
    states = {p.name: _state(p, served_name, wanted) if served_name else "Loading" for p in ready}
    loaded = sorted(p.address for p in ready if p.address and states[p.name] == "Loaded")
    order = sorted(ready, key=lambda p: (states[p.name] == "Loaded", p.name))
    listed = [
        AdapterPod(
            name=p.name,
            address=p.address or "",
            state=states[p.name],
            reason=clip(p.refused, _REASON_CHARS) if p.refused and states[p.name] == "Failed" else None,
        )
        for p in order[:ADAPTER_PODS_LIMIT]
    ]
    return AdapterRelease(
        model_version=model_version,
        served_name=served_name,
        digest=digest,
        path=path,
        addresses=loaded[:ADAPTER_ADDRESSES_LIMIT],
        port=port,
        loaded=len(loaded),
        total=len(ready),
        withdrawn_at=None if wanted else withdrawn_at,
        pods=listed,
    )


def to_load(pods: Sequence[PodSeen], served_name: str) -> list[PodSeen]:
    """The ready pods whose engine answered and does not list the adapter: load it there
    (a pod whose load was refused too: the refusal may pass, e.g. memory freed)."""
    return [p for p in _serving(pods) if p.served is not None and served_name not in p.served]


def to_unload(pods: Sequence[PodSeen], served_name: str) -> list[PodSeen]:
    """The pods whose engine lists the adapter."""
    return [p for p in pods if p.address and p.served is not None and served_name in p.served]


def keeps_adapter(phase: str, deleting: bool = False) -> bool:
    """Whether the adapter belongs on stable's pods: while the release runs and after it
    promoted the adapter (it then serves the base name's traffic); not after a rollback or
    a failure, nor once the release is deleted without having promoted it."""
    if phase == "Promoted":
        return True
    return not deleting and phase not in ("RolledBack", "Failed")


def drained(since: datetime | None, now: datetime, drain: timedelta = DRAIN) -> bool:
    """Whether the requests in flight on the adapter when it lost its traffic (at ``since``;
    None: unknown, taken as long ago) have had ``drain`` to finish."""
    return since is None or now - since >= drain


def problem(spec: GrayReleaseSpec, adapter: AdapterRelease | None) -> Problem | None:
    """Why the adapter candidate cannot get traffic now; None when it can (or is no adapter).

    It can once its engine loads adapters at run time, no pod refused it, and at least one
    ready pod holds it; the pods that do not yet (a new pod, a restarted one) get none of its
    share until they do.
    """
    if spec.candidate.adapter is None:
        return None
    engine = spec.stable.engine
    if engine not in LOADING_ENGINES:
        return Problem(
            "BackendsAvailable",
            "EngineCannotLoadAdapters",
            f"stable.engine is {engine or 'not named'}: tinct loads a LoRA adapter at run time "
            "into vllm or sglang only; name stable's engine",
        )
    if adapter is None or adapter.served_name is None:
        return Problem(
            "BackendsAvailable",
            "AdapterNotLoaded",
            f"the adapter {spec.candidate.adapter.model_version} has no served name yet "
            "(its ModelVersion is not verified)",
        )
    failed = [p for p in adapter.pods if p.state == "Failed"]
    if failed:
        first = failed[0]
        return Problem(
            "BackendsAvailable",
            "AdapterLoadFailed",
            f"{engine} on pod {first.name} refused to load {adapter.served_name}"
            + (f": {first.reason}" if first.reason else "")
            + f" ({len(failed)} of {adapter.total} pods refused it)",
        )
    if adapter.loaded == 0:
        return Problem(
            "BackendsAvailable",
            "AdapterNotLoaded",
            f"{adapter.served_name} is loaded on 0/{adapter.total} of stable's ready pods",
        )
    return None
