"""How much of the traffic a status gives the candidate, and the replicas a share needs; pure.

The weight of each cell comes from one rule, the routing table's
(:func:`~tinct.api.routing.cell_weights`); the decision asks it for the weights a status puts
in force (:func:`weights_for`). A step's *share* is its largest cell weight (with what the cell mirrors): what the
candidate's replicas are sized for (:func:`needed`), by the decision before the weights move
and by the scaling planner (:mod:`~tinct.operator.grayrelease.scaling`) for the bounds.
"""

from __future__ import annotations

import math

from tinct.api.routing import cell_weights
from tinct.api.v1alpha1.grayrelease import GrayReleaseSpec, GrayReleaseStatus

__all__ = ["needed", "shadows_for", "share_at", "steps_of", "weights_for"]


def steps_of(spec: GrayReleaseSpec) -> int:
    """The number of steps: each cell's number of weights."""
    return len(spec.cells[0].weights)


def share_at(spec: GrayReleaseSpec, step: int) -> float:
    """The candidate's share at ``step``: the largest of its cells' weight plus the mirrored
    share of the rest (a dark step, weight 0 and shadow 10, needs replicas for 10 %); 100 past
    the last step."""
    if step >= steps_of(spec):
        return 100.0

    def load(weight: float, shadow: float) -> float:
        return weight + (100.0 - weight) * shadow / 100.0

    return max(load(c.weights[step], c.shadow[step] if c.shadow else 0.0) for c in spec.cells)


def needed(spec: GrayReleaseSpec, status: GrayReleaseStatus, share: float) -> int:
    """Available candidate replicas a ``share`` (percent) of the traffic needs.

    In proportion to what stable served the whole traffic with when the release started
    (``status.stableFloor``, at least ``autoscaling.minReplicas``), and never less than one
    replica for any share above 0.
    """
    if share <= 0:
        return 0
    base = max(status.stable_floor or 1, spec.autoscaling.min_replicas if spec.autoscaling else 1)
    return max(1, math.ceil(base * min(share, 100.0) / 100.0 - 1e-9))


def weights_for(
    spec: GrayReleaseSpec, status: GrayReleaseStatus, withdrawn: bool = False
) -> dict[str, float]:
    """The weight of every cell that ``status`` puts in force (``withdrawn``: the candidate
    is unavailable and serves nothing), by the routing table's weight rule."""
    serving = status.step_started_at is not None and not withdrawn
    return cell_weights(spec, status.phase, status.step, serving=serving)


def shadows_for(
    spec: GrayReleaseSpec, status: GrayReleaseStatus, withdrawn: bool = False
) -> dict[str, float]:
    """The shadow share of every cell that ``status`` puts in force, by the same rule."""
    serving = status.step_started_at is not None and not withdrawn
    return cell_weights(spec, status.phase, status.step, serving=serving, shadow=True)
