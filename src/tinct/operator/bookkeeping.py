"""kopf's bookkeeping on tinct's objects, kept small enough that it can always be written.

kopf remembers, in annotations of every object it handles, the progress of its handlers and
the *diff base*: the spec, labels and annotations it last handled. Copied in full, the diff
base doubles an object's size in its annotations, whose total the API server caps at
256 KiB: a large (schema-valid) spec, or a large annotation of the user's, made every kopf
patch fail with 422, finalizer removal included, and the object could no longer be deleted.

Here the diff base is a digest per stanza (:class:`DigestDiffBaseStorage`): kopf still sees
*that* the spec, the labels or the annotations changed, which is all tinct's handlers ask
(``on.update(field="spec")`` of a ModelVersion re-reads the object; no handler reads the old
values); a few hundred bytes whatever the object's size. Both storages also refuse to add to
a patch what would take an object's annotations past the API server's limit
(:class:`GuardedProgressStorage`), so the rest of kopf's patch (a finalizer's removal) goes
through; each refusal is remembered (:data:`REFUSED`) for the GrayRelease controller to say
so in a condition (``Bookkeeping=False``, ``AnnotationsTooLarge``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import kopf

__all__ = [
    "ANNOTATIONS_LIMIT",
    "REFUSED",
    "DigestDiffBaseStorage",
    "GuardedProgressStorage",
    "annotations_size",
]

#: Bytes the API server allows an object's annotations in total (keys and values).
ANNOTATIONS_LIMIT = 256 * 1024
#: uid -> why kopf's bookkeeping could not be written on that object (cleared once it can).
REFUSED: dict[str, str] = {}


def annotations_size(annotations: Mapping[str, str | None]) -> int:
    """What the API server counts against :data:`ANNOTATIONS_LIMIT`."""
    return sum(len(k) + len(v) for k, v in annotations.items() if v is not None)


def _after(body: kopf.Body, *patches: Mapping[str, Any]) -> dict[str, str | None]:
    """The object's annotations once ``patches`` (merge patches) are applied."""
    out: dict[str, str | None] = dict(body.get("metadata", {}).get("annotations") or {})
    for patch in patches:
        out.update((patch.get("metadata") or {}).get("annotations") or {})
    return out


def _guarded(body: kopf.Body, patch: kopf.Patch, write: Callable[[kopf.Patch], None], what: str) -> None:
    """Call ``write(patch)`` only if what it adds keeps the annotations within the limit."""
    trial = kopf.Patch()
    write(trial)
    size = annotations_size(_after(body, patch, trial))
    uid = str(body.get("metadata", {}).get("uid") or "")
    if size > ANNOTATIONS_LIMIT:
        REFUSED[uid] = (
            f"kopf's {what} would take metadata.annotations to {size} bytes, past the API server's "
            f"{ANNOTATIONS_LIMIT}; it is not written (the object can still be changed and deleted): "
            "make its annotations smaller"
        )
        return
    REFUSED.pop(uid, None)
    write(patch)


def _digest(value: Any) -> dict[str, str]:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest()}


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base as a digest of each stanza: changes are seen, the values not kept."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        full: dict[str, Any] = dict(super().build(body=body, extra_fields=extra_fields))
        meta: dict[str, Any] = dict(full.pop("metadata", None) or {})
        annotations = {
            k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith(f"{self.prefix}/")
        }
        if annotations:
            meta["annotations"] = annotations
        else:
            meta.pop("annotations", None)
        out: dict[str, Any] = {key: _digest(value) for key, value in full.items()}
        if meta:
            out["metadata"] = {key: _digest(value) for key, value in meta.items()}
        return cast(kopf.BodyEssence, out)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        def write(p: kopf.Patch) -> None:
            super(DigestDiffBaseStorage, self).store(body=body, patch=p, essence=essence)

        _guarded(body, patch, write, "diff base")


class GuardedProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's handler progress in annotations, never written past the API server's limit."""

    def store(
        self, *, key: kopf.HandlerId, record: kopf.ProgressRecord, body: kopf.Body, patch: kopf.Patch
    ) -> None:
        def write(p: kopf.Patch) -> None:
            super(GuardedProgressStorage, self).store(key=key, record=record, body=body, patch=p)

        _guarded(body, patch, write, "handler progress")

    def touch(self, *, body: kopf.Body, patch: kopf.Patch, value: str | None) -> None:
        def write(p: kopf.Patch) -> None:
            super(GuardedProgressStorage, self).touch(body=body, patch=p, value=value)

        if value is None:
            write(patch)  # removes kopf's dummy: only ever smaller
        else:
            _guarded(body, patch, write, "wake-up mark")
