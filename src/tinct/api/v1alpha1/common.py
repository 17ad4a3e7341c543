"""Pieces shared by every tinct.io/v1alpha1 resource."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from tinct.api.v1alpha1.rules import broken
from tinct.text import clip

GROUP = "tinct.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: Lowercase RFC 1123 DNS label/subdomain, the shape of a Kubernetes object name.
DNS_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"

#: Characters of a condition's (or a status's) message, as metav1.Condition allows.
MESSAGE_MAX = 32768

#: A message that is clipped to :data:`MESSAGE_MAX` when set, never refused: whatever a
#: file or a spec puts into it, the status that carries it can be written.
Message = Annotated[str, BeforeValidator(lambda v: clip(v, MESSAGE_MAX) if isinstance(v, str) else v)]


class Model(BaseModel):
    """Base for every schema object: camelCase on the wire, snake_case in Python.

    Unknown fields are ignored when parsing (the API server prunes them anyway) so an
    older operator keeps working against a newer CRD.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=False,
        # A field's description is the docstring under it (the CRD joins its lines).
        use_attribute_docstrings=True,
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Any:
        """The rules declared with :func:`~tinct.api.v1alpha1.rules.cel`, as the API server runs them."""
        failed = broken(self)
        if failed:
            raise ValueError("; ".join(r.explain(self) for r in failed))
        return self

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Condition(Model):
    """One aspect of the object's state, as Kubernetes conditions are: a type, whether it
    holds, why, and since when."""

    # Shaped like metav1.Condition.
    type: str = Field(max_length=316)
    """Condition type in CamelCase, e.g. Verified."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds: True, False, or Unknown when it cannot be told."""
    reason: str = Field(default="", max_length=1024)
    """Machine-readable CamelCase reason for the last transition (docs/troubleshooting.md has a section for
    each)."""
    message: Message = Field(default="", max_length=MESSAGE_MAX)
    """Human-readable details."""
    last_transition_time: datetime | None = None
    """When status last changed (RFC 3339); a new message alone does not move it."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation of the spec this condition was set for."""


class ObjectMeta(Model):
    """The few metadata fields the operator reads."""

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


SpecT = TypeVar("SpecT", bound=Model)
StatusT = TypeVar("StatusT", bound=Model)


class Resource(Model, Generic[SpecT, StatusT]):
    """The envelope every tinct resource shares; a kind narrows ``kind`` and names its models."""

    api_version: str = API_VERSION
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SpecT
    status: StatusT | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        """The resource from an object as the API (or kopf's ``body``) hands it over."""
        return cls.model_validate(
            {"metadata": dict(body["metadata"]), "spec": dict(body["spec"]), "status": body.get("status")}
        )


def set_condition(
    conditions: list[Condition],
    new: Condition,
    now: datetime,
) -> list[Condition]:
    """Return ``conditions`` with ``new`` in place of the condition of its type.

    ``lastTransitionTime`` changes only when the status changes, as kubectl users expect.
    """
    out: list[Condition] = []
    replaced = False
    for c in conditions:
        if c.type != new.type:
            out.append(c)
            continue
        replaced = True
        stamp = c.last_transition_time if c.status == new.status and c.last_transition_time else now
        out.append(new.model_copy(update={"last_transition_time": stamp}))
    if not replaced:
        out.append(new.model_copy(update={"last_transition_time": now}))
    return out


def defaulted(cls: type[Model]) -> Any:
    """A field that defaults to ``cls()``, with that full default in the CRD schema too.

    The API server validates a schema default against the object's CEL rules without
    defaulting inside it first, so the default must be the complete object, not ``{}``.
    """
    return Field(default_factory=cls, json_schema_extra={"default": cls().wire()})
