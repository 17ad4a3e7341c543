"""A GrayRelease status the operator can vouch for: sealed when written, checked against its record.

Anyone allowed to write ``grayreleases/status`` (any role granting the group's resources
with a wildcard) could write ``phase: Promoted`` and have the controller, which starts each
round from the recorded status, put the candidate at 100 %. Status is a record for people,
not a command: the controller acts only on a status it can prove it wrote.

- **The seal.** Every status the operator writes carries ``status.sequence`` (one more than
  the status it was decided from) and ``status.seal``, an HMAC-SHA256 over the status and
  the release's uid with a key only the operator holds (``TINCT_STATUS_KEY_FILE``, from a
  Secret the chart generates once; :func:`seal`). A status written by anyone else does not
  verify.
- **The record.** Beside the routing table it writes — in the table namespace, where only
  the operator writes — the operator keeps a :class:`Record` of the last status it wrote:
  its sequence, its digest and its decision core (phase, step, attempt, transitions, table
  version, counters, actions seen...). A sealed status older than the record (one replayed
  from before) is refused too; a status identical to the record is the operator's own even
  under another key (a restart without a configured key).

:func:`verdict` says whether a status is the operator's own; when it is not, the round
starts from the status the operator wrote last (its memory, else the record's core), writes
that back sealed, and reports the tamper (a Warning Event ``StatusTampered``,
``StatusVerified=False``). A status written and sealed whose record was not written yet (the
operator killed between the two) is newer than the record and verifies: it is not taken for
a tamper.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tinct.api.routing import RoutingTable
from tinct.api.v1alpha1.grayrelease import GrayReleaseStatus

__all__ = [
    "RECORD_ANNOTATION",
    "Record",
    "canonical",
    "digest",
    "parse_record",
    "seal",
    "sealed",
    "verdict",
]

#: Annotation of the routing-table ConfigMap holding the :class:`Record` of its release.
RECORD_ANNOTATION = "tinct.io/status-record"
_SCHEME = "hmac-sha256:"
#: Fields of a status people read and the controller never decides from: left out of the core.
_NOT_CORE = {"conditions", "history", "message", "autoscaling", "seal"}
log = logging.getLogger(__name__)


def _normal(status: GrayReleaseStatus) -> dict[str, Any]:
    """``status`` as the API server gives it back (validated again, so rounding and defaults
    are those a reader applies), without its seal."""
    again = GrayReleaseStatus.model_validate(status.model_dump(by_alias=True, mode="json"))
    doc: dict[str, Any] = again.model_dump(by_alias=True, mode="json", exclude={"seal"})
    return doc


def canonical(status: GrayReleaseStatus) -> bytes:
    """The bytes a seal and a digest are of: the status in one spelling, without its seal."""
    return json.dumps(_normal(status), sort_keys=True, separators=(",", ":")).encode()


def digest(status: GrayReleaseStatus) -> str:
    return hashlib.sha256(canonical(status)).hexdigest()


def seal(key: bytes, uid: str, status: GrayReleaseStatus) -> str:
    """The seal of ``status`` of the release ``uid``."""
    mac = hmac.new(key, uid.encode() + b"\n" + canonical(status), hashlib.sha256)
    return _SCHEME + mac.hexdigest()


def sealed(key: bytes, uid: str, status: GrayReleaseStatus, sequence: int) -> GrayReleaseStatus:
    """``status`` as the operator writes it: numbered ``sequence`` and sealed (changed in place)."""
    status.sequence = sequence
    status.seal = None
    status.seal = seal(key, uid, status)
    return status


def _verifies(key: bytes, uid: str, status: GrayReleaseStatus) -> bool:
    return status.seal is not None and hmac.compare_digest(status.seal, seal(key, uid, status))


@dataclass(frozen=True)
class Record:
    """The operator's record of the last status it wrote for one release."""

    uid: str
    sequence: int
    #: :func:`digest` of that status.
    digest: str
    #: That status without what only people read (:data:`_NOT_CORE`): enough to go on from.
    core: dict[str, Any]

    @classmethod
    def of(cls, uid: str, status: GrayReleaseStatus) -> Record:
        core = {k: v for k, v in _normal(status).items() if k not in _NOT_CORE}
        if isinstance(core.get("lastAnalysis"), dict):
            last = core["lastAnalysis"]
            core["lastAnalysis"] = {k: last[k] for k in ("time", "verdict", "step", "requests") if k in last}
        return cls(uid, status.sequence, digest(status), core)

    def to_json(self) -> str:
        doc = {"uid": self.uid, "sequence": self.sequence, "digest": self.digest, "core": self.core}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    def status(self) -> GrayReleaseStatus:
        """The status to go on from: the core of the one recorded."""
        return GrayReleaseStatus.model_validate(self.core)


def parse_record(text: str | None) -> Record | None:
    """The :class:`Record` of an annotation's value; None when absent or unreadable."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        record = Record(str(doc["uid"]), int(doc["sequence"]), str(doc["digest"]), dict(doc["core"]))
        record.status()
    except (ValueError, KeyError, TypeError, ValidationError):
        return None
    return record


def verdict(
    key: bytes,
    uid: str,
    status: GrayReleaseStatus | None,
    *,
    valid: bool = True,
    record: Record | None = None,
    table: RoutingTable | None = None,
) -> str | None:
    """Why ``status`` (``valid``: it parsed) of the release ``uid`` is not the operator's own;
    None when it is.

    ``record`` is the operator's record of the release (of any uid), ``table`` the routing
    table found for it: a status from before statuses were sealed is taken when it agrees with
    the table the operator wrote for it then.
    """
    mine = record if record is not None and record.uid == uid else None
    if not valid:
        return "it is not a status the operator could have written (it does not parse)"
    if status is None:
        return "it was removed" if mine is not None else None
    if mine is not None and digest(status) == mine.digest:
        return None
    if _verifies(key, uid, status):
        if mine is None or status.sequence > mine.sequence:
            return None
        return (
            f"it is an older status (sequence {status.sequence}) than the last one the operator "
            f"wrote (sequence {mine.sequence}): replayed"
        )
    if mine is None and status.seal is None:
        if status == GrayReleaseStatus():
            return None  # nothing recorded yet: the same as no status
        if table is not None and table.uid == uid and _agrees(status, table):
            log.info("release %s: adopting its status from before statuses were sealed", uid)
            return None
    return "its seal does not verify: it was not written by the operator"


def _agrees(status: GrayReleaseStatus, table: RoutingTable) -> bool:
    routing = status.routing
    return (
        routing is not None
        and routing.version == table.version
        and status.phase == table.state
        and status.step == table.step
    )
