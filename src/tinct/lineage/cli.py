"""``tinct lineage``: SQL over the lineage tables, a model's history, and interface diffs.

Only the standard library is imported at module level so ``tinct --help`` stays fast.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TextIO

from tinct.lineage.limits import DEFAULT_MEMORY_LIMIT, DEFAULT_TIMEOUT, Limits, size_text
from tinct.lineage.root import DEFAULT_ROOT, ENV, lineage_root

__all__ = ["register"]


def _root(args: argparse.Namespace) -> str:
    return lineage_root(args.root)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):  # map columns arrive as [(key, value), ...]
        return json.dumps(dict(value) if all(isinstance(v, tuple) for v in value) else value, default=str)
    return str(value)


def _rows(table: Any) -> Iterator[dict[str, Any]]:
    """The rows of ``table``, a batch at a time: never all of them as Python objects at once."""
    for batch in table.to_batches():
        yield from batch.to_pylist()


def _print(table: Any, fmt: str, out: TextIO) -> None:
    names: list[str] = list(table.column_names)
    if fmt == "json":  # what json.dump(rows, indent=2) writes, a row at a time
        out.write("[")
        count = 0
        for r in _rows(table):
            row = {
                k: (dict(v) if isinstance(v, list) and v and isinstance(v[0], tuple) else v)
                for k, v in r.items()
            }
            out.write(
                ("\n" if count == 0 else ",\n")
                + textwrap.indent(json.dumps(row, default=str, indent=2), "  ")
            )
            count += 1
        out.write("\n]\n" if count else "]\n")
        return
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(names)
        for r in _rows(table):
            writer.writerow([_cell(r[n]) for n in names])
        return
    widths = [len(n) for n in names]
    for r in _rows(table):
        widths = [max(w, len(_cell(r[n]))) for w, n in zip(widths, names, strict=True)]
    out.write("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip() + "\n")
    for r in _rows(table):
        out.write("  ".join(_cell(r[n]).ljust(w) for n, w in zip(names, widths, strict=True)).rstrip() + "\n")
    rows = table.num_rows
    out.write(f"({rows} row{'s' if rows != 1 else ''})\n")


def _run(args: argparse.Namespace, produce: Callable[[], Any]) -> int:
    """Print what ``produce`` returns; 2 for a refused or mistyped query or a time outside the
    history, 1 for any other failure (a limit passed included)."""
    from tinct.lineage.errors import NotAQueryError, OutsideHistoryError, QueryError

    try:
        table = produce()
    except (NotAQueryError, QueryError, OutsideHistoryError, _UsageError) as exc:
        print(f"tinct lineage {args.lineage_command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a QueryLimitError among them: its message is one line
        print(f"tinct lineage {args.lineage_command}: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    if table is None:
        return 1
    _print(table, args.format, sys.stdout)
    return 0


class _UsageError(ValueError):
    pass


def _when(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise _UsageError(
            f"--as-of {text!r} is not an ISO-8601 time (e.g. 2026-01-01 or 2026-01-01T12:00:00Z)"
        ) from None


#: Units ``--memory-limit`` takes, as Kubernetes quantities do (``256Mi``) or with a B.
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def _memory(text: str) -> int:
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]i?)?b?", text.strip(), re.IGNORECASE)
    size = int(float(found[1]) * _UNITS[(found[2] or "").lower()]) if found else 0
    if size < 2**20:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size of at least 1Mi (e.g. 256Mi, 1Gi)")
    return size


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds more than 0")
    return seconds


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(memory=args.memory_limit, timeout=args.timeout)


def _cmd_sql(args: argparse.Namespace) -> int:
    from tinct.lineage.sql import query

    def produce() -> Any:
        as_of = _when(args.as_of) if args.as_of else None
        return query(
            args.query, _root(args), as_of_version=args.as_of_version, as_of=as_of, limits=_limits(args)
        )

    return _run(args, produce)


#: Digest columns of ``lineage show``, cut to this many hex digits in the table format.
_SHORT = 12


def _cmd_show(args: argparse.Namespace) -> int:
    from tinct.lineage.sql import history, query

    def produce() -> Any:
        root = _root(args)
        table = history(args.model, root, limits=_limits(args))
        if table.num_rows == 0:
            models = query(
                "SELECT DISTINCT model FROM model_versions ORDER BY model LIMIT 21",
                root,
                limits=_limits(args),
            )
            known = [str(m) for m in models.column("model").to_pylist()]
            listed = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
            print(
                f"tinct lineage show: no recorded history of model {args.model!r} under {root} "
                f"(models recorded: {listed or 'none yet'})",
                file=sys.stderr,
            )
            return None
        if args.format == "table":
            import pyarrow as pa

            for i, name in enumerate(table.column_names):
                if name.endswith("_sha256"):
                    short = pa.array(
                        [v[:_SHORT] if v else v for v in table.column(i).to_pylist()], pa.string()
                    )
                    table = table.set_column(i, name.removesuffix("_sha256"), short)
        return table

    return _run(args, produce)


def _diff_text(report: dict[str, Any], out: TextIO) -> None:
    out.write(f"{report['from']['label']} -> {report['to']['label']}\n")
    diffs = report["differences"]
    if not diffs:
        out.write("no interface differences\n")
    else:
        cols = ("level", "kind", "where", "detail")
        widths = [max(len(c), *(len(d[c]) for d in diffs)) for c in cols[:3]]
        out.write("  ".join(c.upper().ljust(w) for c, w in zip(cols[:3], widths, strict=True)) + "  DETAIL\n")
        for d in diffs:
            cells = [d[c].ljust(w) for c, w in zip(cols[:3], widths, strict=True)]
            out.write("  ".join(cells) + "  " + d["detail"] + "\n")
    out.write(f"declared {str(report['declared']).upper()}, measured {report['measured'].upper()}: ")
    out.write(("compatible" if report["compatible"] else "NOT compatible") + f" ({report['verdict']})\n")


#: Exit statuses of ``tinct lineage diff``: what a script gating a release reads.
DIFF_COMPATIBLE = 0
DIFF_UNCOMPARED = 1
DIFF_INCOMPATIBLE = 3
DIFF_EXIT_CODES = {
    DIFF_COMPATIBLE: "compatible: the declared version step covers every measured difference",
    DIFF_UNCOMPARED: "could not compare: a version is not recorded, a name is ambiguous, or the "
    "lineage tables could not be read",
    2: "usage: an argument tinct refuses before doing anything",
    DIFF_INCOMPATIBLE: "NOT compatible: the declared step is smaller than the measured change (or "
    "MV_B is not above MV_A)",
    130: "interrupted (Ctrl-C)",
}


def _cmd_diff(args: argparse.Namespace) -> int:
    """Print the comparison; its exit status is one of :data:`DIFF_EXIT_CODES`."""
    from tinct.artifacts.contract import verdict
    from tinct.lineage.interfaces import RecordedNotFoundError, recorded_interface

    try:
        old = recorded_interface(args.old, _root(args), namespace=args.namespace)
        new = recorded_interface(args.new, _root(args), namespace=args.namespace)
    except RecordedNotFoundError as exc:
        print(f"tinct lineage diff: {exc}", file=sys.stderr)
        return DIFF_UNCOMPARED
    except Exception as exc:
        print(f"tinct lineage diff: cannot read the lineage tables: {exc}", file=sys.stderr)
        return DIFF_UNCOMPARED
    v = verdict(old.version, new.version, old.interface, new.interface)
    report = {
        "from": {"label": old.label, "model": old.model, "version": old.version, "name": old.name},
        "to": {"label": new.label, "model": new.model, "version": new.version, "name": new.name},
        "declared": v.declared,
        "measured": v.measured,
        "compatible": v.ok,
        "breaking": v.breaking,
        "verdict": v.explain(old.version, new.version),
        "differences": [d.wire() for d in v.differences],
    }
    if old.model != new.model:
        report["verdict"] = f"different models ({old.model}, {new.model}); " + str(report["verdict"])
    if args.output == "json":
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _diff_text(report, sys.stdout)
    return DIFF_COMPATIBLE if v.ok else DIFF_INCOMPATIBLE


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        help=f"root URI of the lineage tables (env {ENV}, default {DEFAULT_ROOT})",
    )
    p.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output format")
    p.add_argument(
        "--memory-limit",
        type=_memory,
        default=DEFAULT_MEMORY_LIMIT,
        metavar="SIZE",
        help="memory the query's joins, sorts and aggregations may take, and again its answer; a query "
        f"needing more fails, nothing spills to disk (e.g. 1Gi; default {size_text(DEFAULT_MEMORY_LIMIT)})",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds the query may run before it is stopped (default {DEFAULT_TIMEOUT:g})",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lineage",
        help="query the lineage tables (model_versions, artifacts, interfaces, release_events)",
        description="Read-only SQL (DataFusion) over the Delta lineage tables.",
    )
    lsub = p.add_subparsers(dest="lineage_command", metavar="COMMAND", required=True)
    q = lsub.add_parser("sql", help="run a read-only SQL query over the tables and the model_lineage view")
    q.add_argument("query", help='e.g. "SELECT model, version, event FROM model_versions"')
    _common(q)
    when = q.add_mutually_exclusive_group()
    when.add_argument(
        "--as-of-version",
        type=int,
        metavar="N",
        help="read model_versions at Delta version N (status.lineage.version), the others as of its time",
    )
    when.add_argument("--as-of", metavar="TIMESTAMP", help="read every table as of an ISO-8601 time")
    q.set_defaults(func=_cmd_sql)
    s = lsub.add_parser(
        "show",
        help="print the recorded history of one model",
        description="Print every recorded event of one model, oldest first (digests cut to "
        f"{_SHORT} hex digits in the table format; --format json or csv gives them whole).",
    )
    s.add_argument("model", help="spec.model of the ModelVersions, e.g. llama3-8b")
    _common(s)
    s.set_defaults(func=_cmd_show)
    d = lsub.add_parser(
        "diff",
        help="compare the recorded interfaces of two ModelVersions",
        description=(
            "Print the differences between the interfaces of two ModelVersions as recorded in the "
            "interfaces table, each with its class (breaking, additive, none), and whether the declared "
            "version step allows them. The exit status says which, so a script can gate a release "
            "on it: 0 compatible, 3 not compatible, 1 could not compare."
        ),
        epilog="exit status:\n" + "\n".join(f"  {code:<4} {what}" for code, what in DIFF_EXIT_CODES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("old", metavar="MV_A", help="ModelVersion name or model@version, e.g. llama3-8b@1.2.0")
    d.add_argument("new", metavar="MV_B", help="the ModelVersion compared with MV_A")
    d.add_argument("-n", "--namespace", help="namespace of both ModelVersions (when a name is in several)")
    d.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")
    d.add_argument(
        "--root",
        help=f"root URI of the lineage tables (env {ENV}, default {DEFAULT_ROOT})",
    )
    d.set_defaults(func=_cmd_diff)
