"""Which Prometheus a GrayRelease reads: always one the operator is configured with."""

from __future__ import annotations

from pydantic import Field

from tinct.api.v1alpha1.common import Model
from tinct.api.v1alpha1.rules import Rule, cel

__all__ = ["PrometheusRef"]


class PrometheusRef(Model):
    """Which Prometheus an analysis (or KEDA, for autoscaling.keda) reads: one the operator is
    configured with (tinct operator --prometheus-url and --prometheus, the chart's
    operator.prometheus). Name one, or give neither field for the operator's default; any
    other URL is refused."""

    # The operator queries only URLs from its own configuration, so creating a GrayRelease
    # never makes it fetch an address of the creator's choosing.

    model_config = cel(
        Rule(
            cel="!(has(self.name) && has(self.url))",
            holds=lambda s: s.name is None or s.url is None,
            message="give prometheus.name or prometheus.url, not both",
        )
    )

    name: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """Name of a Prometheus in the operator's configuration (tinct operator --prometheus NAME=URL)."""
    url: str | None = Field(default=None, pattern=r"^https?://.+", max_length=2048)
    """URL of a Prometheus; must be one the operator is configured with (its default or one of its named
    ones), else the release is refused."""
