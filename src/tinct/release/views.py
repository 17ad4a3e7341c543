"""What ``tinct release status`` and ``tinct release list`` print: the dye matrix once or live,
and one line per release; as text, JSON or YAML.

``status --watch`` follows the release through a watch of the API server and redraws the
matrix whenever the object changes: in place on a terminal, one frame after another (a
blank line between them) otherwise, one document per change with ``-o json`` or ``-o yaml``.
It ends when the release is deleted, or on Ctrl-C.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["list_rows", "print_list", "print_status", "status_data", "watch_status"]

PLURAL = "grayreleases"
#: Clear the screen and home the cursor: the matrix is redrawn in place on a terminal.
_CLEAR = "\033[H\033[2J"
_WATCH_SECONDS = 60


def status_data(obj: dict[str, Any]) -> dict[str, Any]:
    """The matrix data of a GrayRelease object as the API returns it."""
    from tinct.api.v1alpha1.grayrelease import GrayRelease
    from tinct.release.matrix import matrix

    release = GrayRelease.model_validate(
        {"metadata": obj["metadata"], "spec": obj["spec"], "status": obj.get("status") or None}
    )
    return matrix(release)


def _dump(data: Any, output: str, out: TextIO) -> None:
    if output == "json":
        json.dump(data, out, indent=2, default=str)
        out.write("\n")
    else:
        import yaml

        out.write(yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False))


def print_status(obj: dict[str, Any], output: str, color: bool, out: TextIO = sys.stdout) -> None:
    from tinct.release.matrix import render

    data = status_data(obj)
    if output == "text":
        out.write(render(data, color=color))
    else:
        _dump(data, output, out)


def _events(api: Any, ns: str, name: str, stop: Callable[[], bool]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(type, object) of every change of ``ns/name``, from a list then watches resumed where they
    left off; a watch too old to resume lists again."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    from tinct.api.v1alpha1.common import GROUP, VERSION

    selector = f"metadata.name={name}"
    rv: str | None = None
    while not stop():
        if rv is None:
            listing = api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, field_selector=selector)
            rv = listing["metadata"]["resourceVersion"]
            items = listing.get("items") or []
            if not items:
                yield "DELETED", {}
                return
            yield "ADDED", items[0]
        w = watch.Watch()  # type: ignore[no-untyped-call]
        try:
            for ev in w.stream(  # type: ignore[no-untyped-call]
                api.list_namespaced_custom_object,
                GROUP,
                VERSION,
                ns,
                PLURAL,
                field_selector=selector,
                resource_version=rv,
                timeout_seconds=_WATCH_SECONDS,
                allow_watch_bookmarks=True,
            ):
                obj = ev["object"]
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    yield ev["type"], obj
                    if ev["type"] == "DELETED":
                        return
        except ApiException as exc:
            if exc.status != 410:
                raise
            rv = None  # too old to resume: list again
        finally:
            w.stop()  # type: ignore[no-untyped-call]


def watch_status(
    api: Any,
    ns: str,
    name: str,
    output: str,
    color: bool,
    *,
    out: TextIO = sys.stdout,
    stop: Callable[[], bool] = lambda: False,
) -> int:
    """Redraw the status of ``ns/name`` at every change until it is deleted (0) or not found (1)."""
    from tinct.release.matrix import render

    tty = output == "text" and out.isatty()
    last: str | None = None
    frames = 0
    for kind, obj in _events(api, ns, name, stop):
        if kind == "DELETED":
            if frames == 0:
                print(f"tinct release: grayrelease {ns}/{name} not found", file=sys.stderr)
                return 1
            out.write(f"grayrelease {ns}/{name} deleted\n")
            out.flush()
            return 0
        data = status_data(obj)
        if output != "text":
            text = json.dumps(data, default=str, sort_keys=True)
            if text == last:
                continue
            last = text
            if output == "yaml":
                out.write("---\n")
            _dump(data, output, out)
        else:
            frame = render(data, color=color)
            if frame == last:
                continue  # a change that shows nowhere in the matrix (e.g. a heartbeat)
            last = frame
            stamp = datetime.now(UTC).strftime("%H:%M:%S")
            if tty:
                out.write(_CLEAR + frame + f"\nupdated {stamp} UTC; watching for changes (Ctrl-C ends)\n")
            else:
                out.write(("\n" if frames else "") + frame)
        frames += 1
        out.flush()
    return 0


def _age(created: str | None, now: datetime) -> str:
    if not created:
        return "-"
    seconds = int((now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def list_rows(items: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """One row per GrayRelease: what ``tinct release list`` shows."""
    rows = []
    for obj in items:
        st = obj.get("status") or {}
        spec = obj.get("spec") or {}
        steps = len((spec.get("cells") or [{}])[0].get("weights") or [])
        rows.append(
            {
                "namespace": obj["metadata"].get("namespace"),
                "name": obj["metadata"]["name"],
                "phase": st.get("phase") or "Pending",
                "step": st.get("progress") or (f"1/{steps}" if steps else "-"),
                "weight": st.get("candidateWeight", 0),
                "analysis": (st.get("lastAnalysis") or {}).get("verdict") or "-",
                "stable": (spec.get("stable") or {}).get("modelVersion"),
                "candidate": (spec.get("candidate") or {}).get("modelVersion"),
                "age": _age(obj["metadata"].get("creationTimestamp"), now),
                "message": st.get("message") or "",
            }
        )
    return sorted(rows, key=lambda r: (r["namespace"] or "", r["name"]))


def print_list(
    rows: list[dict[str, Any]], output: str, all_namespaces: bool, out: TextIO = sys.stdout
) -> None:
    if output != "text":
        _dump(rows, output, out)
        return
    cols = ["namespace"] if all_namespaces else []
    cols += ["name", "phase", "step", "weight", "analysis", "stable", "candidate", "age", "message"]
    cells = [[f"{r[c]:g}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n")
