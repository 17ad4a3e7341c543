"""The dye matrix of a GrayRelease: a row per cell, a column per step; pure rendering.

:func:`matrix` turns the resource into a plain dict (what ``tinct release status -o json``
and ``-o yaml`` print); :func:`render` lays it out as text, with ANSI colours when asked.

Steps are shown one way everywhere, as kubectl's STEP column and the status messages show
them: ``2/4`` is the second step of four (``status.step``, the index into each cell's
weights, is 1 there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseStatus, cell_key

__all__ = ["matrix", "render"]

_RESET = "\033[0m"
_STYLE = {
    "bold": "\033[1m",
    "dim": "\033[2m",
    "green": "\033[32m",
    "red": "\033[31m",
    "yellow": "\033[33m",
    "cyan": "\033[36m",
}
_PHASE_STYLE = {
    "Progressing": "cyan",
    "Promoted": "green",
    "RolledBack": "red",
    "Failed": "red",
    "Paused": "yellow",
    "Pending": "yellow",
}
_VERDICT_STYLE = {"Pass": "green", "Fail": "red", "Inconclusive": "yellow", "Error": "red"}


def step_label(index: int | None, steps: int) -> str | None:
    """``2/4`` for step index 1 of 4; ``promotion`` past the last step."""
    if index is None:
        return None
    return "promotion" if index >= steps else f"{index + 1}/{steps}"


def matrix(release: GrayRelease) -> dict[str, Any]:
    """The release's matrix and last analysis as plain data."""
    st = release.status or GrayReleaseStatus()
    steps = len(release.spec.cells[0].weights)
    last = st.last_analysis.wire() if st.last_analysis else None
    if last is not None and st.last_analysis is not None:
        last["step"] = step_label(st.last_analysis.step, steps)
    return {
        "name": release.metadata.name,
        "namespace": release.metadata.namespace,
        "phase": st.phase,
        "step": st.progress or step_label(min(st.step, steps - 1), steps),
        "steps": steps,
        "current": min(st.step, steps - 1),
        "nextStep": step_label(st.next_step, steps),
        "lastAction": st.last_action.wire() if st.last_action else None,
        "message": st.message,
        "tableVersion": st.routing.version if st.routing else None,
        "cells": [
            {
                "cell": cell_key(c.match),
                "weights": list(c.weights),
                "inForce": st.weights.get(cell_key(c.match)),
                "shadow": list(c.shadow) if c.shadow else None,
                "shadowInForce": st.shadows.get(cell_key(c.match)),
            }
            for c in release.spec.cells
        ],
        "failedAnalyses": st.failed_analyses,
        "inconclusiveAnalyses": st.inconclusive_analyses,
        "lastAnalysis": last,
        "autoscaling": [s.wire() for s in st.autoscaling],
        "adapter": st.adapter.wire() if st.adapter else None,
        "conditions": [c.wire() for c in st.conditions],
    }


def adapter_line(adapter: dict[str, Any]) -> str:
    """``adapter NAME loaded on 5/6 pods``, and the pods that do not have it."""
    name = adapter.get("servedName") or adapter["modelVersion"]
    line = f"adapter {name} loaded on {adapter.get('loaded', 0)}/{adapter.get('total', 0)} pods"
    missing = [p for p in adapter.get("pods", []) if p.get("state") != "Loaded"]
    if missing:
        line += ": " + ", ".join(
            f"{p['name']} {p['state']}" + (f" ({p['reason']})" if p.get("reason") else "") for p in missing
        )
    return line


def _time(value: Any) -> str:
    """An RFC 3339 time to the second, in UTC."""
    text = str(value)
    try:
        from datetime import UTC, datetime

        return (
            datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        )
    except ValueError:
        return text


def _num(w: float | None) -> str:
    if w is None:
        return "-"
    return f"{w:g}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}%"


def _agreement(a: dict[str, Any]) -> str:
    return (
        f"agreement {_pct(a.get('adjusted'))} after a noise floor of {_pct(a.get('noiseFloor'))} "
        f"({a.get('pairs', 0):.0f} pairs, {a.get('noisePairs', 0):.0f} noise pairs)"
    )


def _shadow_lines(
    data: dict[str, Any], shadow: dict[str, Any] | None, width: int, paint: Callable[[str, str | None], str]
) -> list[str]:
    """Each mirroring cell's shadow shares and its agreement in the last analysis."""
    mirrored = [c for c in data["cells"] if c.get("shadow")]
    if not mirrored:
        return []
    lines = [paint("shadow (percent mirrored per step; agreement in the last analysis)", "bold")]
    by_cell = {c["cell"]: c for c in (shadow or {}).get("cells", [])}
    for c in mirrored:
        shares = "/".join(_num(x) for x in c["shadow"])
        row = f"  {c['cell'].ljust(width)}  {shares}  in force {_num(c.get('shadowInForce'))}"
        seen = by_cell.get(c["cell"])
        if seen:
            row += f"  {_agreement(seen)} {paint(seen['verdict'], _VERDICT_STYLE.get(seen['verdict']))}"
        lines.append(row)
    if shadow:
        worst = f"; least: {shadow['worstCell']}" if shadow.get("worstCell") else ""
        lines.append(f"  overall {_agreement(shadow)}, {shadow.get('skipped', 0):.0f} skipped{worst}")
    return lines


def render(data: dict[str, Any], color: bool = False) -> str:
    """Text layout of :func:`matrix`; ``color`` adds ANSI styles (for a terminal)."""

    def paint(text: str, style: str | None) -> str:
        if not color or not style:
            return text
        return f"{_STYLE[style]}{text}{_RESET}"

    phase, current, steps = data["phase"], data["current"], data["steps"]
    marked = phase in ("Progressing", "Paused", "Pending")
    head = (
        f"GrayRelease {data['namespace']}/{data['name']}  phase {paint(phase, _PHASE_STYLE.get(phase))}"
        f"  step {data['step']}  table v{data['tableVersion'] if data['tableVersion'] is not None else '-'}"
    )
    lines = [head]
    if data.get("message"):
        lines.append(f"  {data['message']}")
    width = max([len("cell")] + [len(c["cell"]) for c in data["cells"]])
    cols = [f"step {i + 1}" + ("*" if marked and i == current else "") for i in range(steps)]
    colw = max(8, *(len(c) for c in cols))
    header = "cell".ljust(width) + "".join(c.rjust(colw) for c in cols) + "in force".rjust(colw + 2)
    lines.append(paint(header, "bold"))
    for c in data["cells"]:
        row = c["cell"].ljust(width)
        for i, w in enumerate(c["weights"]):
            text = _num(w).rjust(colw)
            row += paint(text, "cyan" if marked and i == current else "dim")
        now = c["inForce"]
        row += paint(_num(now).rjust(colw + 2), "green" if now else None)
        lines.append(row)
    la = data.get("lastAnalysis")
    lines.extend(_shadow_lines(data, (la or {}).get("shadow"), width, paint))
    if la:
        verdict = la["verdict"]
        lines.append(
            f"last analysis {_time(la['time'])} (step {la.get('step') or '-'}): "
            f"{paint(verdict, _VERDICT_STYLE.get(verdict))}"
            f"  failed {data['failedAnalyses']}, inconclusive in a row {data['inconclusiveAnalyses']}"
        )
        metrics = la.get("metrics", [])
        tw = max([28, *(len(m["threshold"]) for m in metrics)])
        name_w = max([14] + [len(m["name"]) for m in metrics])
        for m in metrics:
            value = "n/a" if m.get("value") is None else f"{m['value']:.4g}"
            note = f"  {m['message']}" if m.get("message") else ""
            if m.get("series"):  # an engine metric: which of the engine's names it was read from
                note += f"  ({m['series']})"
            lines.append(
                f"  {m['name']:<{name_w}} {value:>10}  {m['threshold']:<{tw}} "
                f"{paint(m['verdict'], _VERDICT_STYLE.get(m['verdict']))}{note}"
            )
        for cell in la.get("cells", []):
            lines.append(
                f"  cell {cell['cell']}: {paint(cell['verdict'], _VERDICT_STYLE.get(cell['verdict']))}"
                f" ({cell.get('requests', 0):.0f} requests)"
            )
    if data.get("adapter"):
        lines.append(adapter_line(data["adapter"]))
    for s in data.get("autoscaling", []):
        managed = "" if s.get("managed", True) else "  (not managed: see AutoscalingReady)"
        scaler = f"scaledobject {s['scaledObject']}" if s.get("scaledObject") else f"hpa {s['hpa']}"
        signal = f" on {s['query']}" if s.get("query") else ""
        lines.append(f"{scaler}: {s['minReplicas']}-{s['maxReplicas']} replicas{signal}{managed}")
    act = data.get("lastAction")
    if act:
        lines.append(f"last action {act['value']}: {act['result']}  {act.get('message', '')}".rstrip())
    for cond in data.get("conditions", []):
        if cond["type"] in ("Ready", "Progressing"):
            continue  # the phase in the first line says it
        bad = cond["status"] == "True" if cond["type"] == "Degraded" else cond["status"] != "True"
        if bad:
            lines.append(
                paint(f"{cond['type']}={cond['status']} {cond['reason']}: {cond['message']}", "yellow")
            )
    return "\n".join(lines) + "\n"
