"""``spec.shadow`` of a GrayRelease: how mirrored requests are bounded and their answers compared.

A cell's shadow share (``cells[].shadow``, percent per step) has the routers mirror that share
of the requests stable answers to the candidate; the comparer (``tinct comparer``) compares
both answers and exports the agreement the ``shadow-agreement`` analysis metric reads. These
settings bound the mirrors (the candidate's GPUs are the scarce resource) and say how the
answers are compared. The routing table carries them with the two ModelVersions
(:class:`ShadowTable`), so routers and the comparer read one document.
"""

from __future__ import annotations

from pydantic import Field

from tinct.api.v1alpha1.common import Model, defaulted
from tinct.api.v1alpha1.rules import Rule, cel

__all__ = ["Judge", "LengthRatio", "Shadow", "ShadowTable"]

_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class LengthRatio(Model):
    """Bounds of the candidate's answer length over stable's for a non-deterministic request."""

    model_config = cel(
        Rule(
            cel="self.min <= self.max",
            holds=lambda s: s.min <= s.max,
            message="lengthRatio.min must not be above lengthRatio.max",
        )
    )

    min: float = Field(default=0.5, ge=0, le=100)
    """Shortest allowed ratio (default 0.5)."""
    max: float = Field(default=2.0, ge=0, le=100)
    """Longest allowed ratio (default 2.0)."""


class Judge(Model):
    """An LLM that judges a sample of the pairs the cheaper layers call different.

    The judge is the only place tinct sends prompt text to a third service: off unless named.
    """

    name: str = Field(pattern=_NAME, max_length=63)
    """Name of a judge endpoint the comparer is configured with (tinct comparer --judge NAME=URL, the chart's
    comparer.judges): an OpenAI-compatible server the prompt and both answers are posted to. A spec never
    names a URL itself."""
    model: str = Field(min_length=1, max_length=253)
    """The model the judge endpoint is asked for."""
    sample_rate: float = Field(default=0.1, ge=0, le=1)
    """Share (0-1) of the pairs called different that the judge is asked about (default 0.1)."""
    min_confidence: float = Field(default=0.85, ge=0, le=1)
    """A judge verdict counts only at this confidence or above, in both orders of the answers
    (default 0.85)."""
    timeout_seconds: float = Field(default=30, gt=0, le=600)
    """Seconds one judge call may take (default 30)."""


class Shadow(Model):
    """Budgets of the mirrors and how their answers are compared (used where a cell's shadow
    share is above 0)."""

    max_concurrent: int = Field(default=8, ge=1, le=4096)
    """Mirrors in flight per router worker for this release (default 8); more are skipped (reason budget),
    never queued."""
    max_bytes: int = Field(default=262144, ge=1024, le=16 * 1024 * 1024)
    """Bytes of each answer kept for comparison, stable's and the candidate's (default 262144); a longer
    answer makes the pair skipped (too_long)."""
    max_tokens_per_minute: int = Field(default=100000, ge=1, le=1_000_000_000)
    """Prompt tokens (the router's estimate) mirrored per minute per router worker (default 100000); over it a
    mirror is skipped (budget)."""
    timeout_seconds: float = Field(default=60, gt=0, le=3600)
    """Seconds a mirror may take on the candidate, whole answer included (default 60)."""
    noise_share: float = Field(default=10, ge=0, le=50)
    """Percent of mirrors sent to stable a second time instead of the candidate (default 10): stable's
    disagreement with itself, the noise floor subtracted from the candidate's."""
    similarity: float = Field(default=0.8, ge=0, le=1)
    """Token-set ratio (0-1) at or above which the answers of a non-deterministic request (temperature above 0
    and no seed) agree (default 0.8)."""
    length_ratio: LengthRatio = defaulted(LengthRatio)
    keep_text: bool = False
    """Keep prompt and answer text (up to maxTextBytes each) in the shadow_pairs lineage table; default false:
    hashes and lengths only."""
    max_text_bytes: int = Field(default=4096, ge=1, le=65536)
    """Bytes of each text kept with keepText (default 4096)."""
    judge: Judge | None = None
    """An LLM judge for a sample of the pairs found different; none (the default): no prompt text leaves
    tinct."""


class ShadowTable(Shadow):
    """The shadow settings in a routing table, with the ModelVersions the pairs compare."""

    stable_model_version: str | None = Field(default=None, max_length=253)
    candidate_model_version: str | None = Field(default=None, max_length=253)
