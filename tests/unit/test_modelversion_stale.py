"""A ModelVersion event older than the verdict already written is not verified again.

kopf waits a few seconds for its own status patch to come back on the watch and then goes on
with the copy of the object it has; on a slow API server that copy predates the verdict, and
verifying it again would announce the verdict twice (two Warning events for one failure).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tinct.api.v1alpha1.modelversion import ModelVersion
from tinct.operator.modelversion import _handled_meanwhile, reconcile


def _doc(generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": generation},
        "spec": {
            "model": "llama",
            "version": "1.0.0",
            "artifacts": [{"format": "onnx", "uri": "file:///a.onnx"}],
            "runtime": "vllm",
        },
        "status": status,
    }


FAILED = {"phase": "Failed", "observedGeneration": 1, "message": "over a limit"}
HASHING = {"phase": "Hashing", "observedGeneration": 1, "message": "hashing: 40% of 10 bytes"}


class Status:
    """The API server's copy of the object, as ``ctx.status.get_object`` reads it."""

    def __init__(self, live: dict[str, Any] | Exception | None) -> None:
        self.live = live
        self.reads = 0

    def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert (plural, namespace, name) == ("modelversions", "ns", "m")
        self.reads += 1
        if isinstance(self.live, Exception):
            raise self.live
        return self.live


def _ctx(live: dict[str, Any] | Exception | None) -> Any:
    return SimpleNamespace(io=None, status=Status(live))


async def test_an_event_from_before_the_verdict_is_not_verified_again() -> None:
    ctx = _ctx(_doc(status=FAILED))
    stale = ModelVersion.model_validate(_doc(status=HASHING))
    # Verifying would need the rest of the context (hashing, config, lineage): none is here.
    assert await reconcile(stale, ctx) is None
    assert ctx.status.reads == 1


async def test_only_a_verdict_on_the_same_generation_counts() -> None:
    stale = ModelVersion.model_validate(_doc(status=HASHING))
    assert await _handled_meanwhile(stale, _ctx(_doc(status=FAILED)))
    assert not await _handled_meanwhile(stale, _ctx(_doc(status=HASHING)))
    assert not await _handled_meanwhile(stale, _ctx(_doc(status=None)))
    # A newer generation's verdict is not this one's: kopf's update handler has it.
    assert not await _handled_meanwhile(stale, _ctx(_doc(2, {**FAILED, "observedGeneration": 2})))
    assert not await _handled_meanwhile(stale, _ctx(_doc(2, FAILED)))
    # Deleted meanwhile, or unreadable: verified as before.
    assert not await _handled_meanwhile(stale, _ctx(None))
    assert not await _handled_meanwhile(stale, _ctx(RuntimeError("connection refused")))
