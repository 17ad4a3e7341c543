"""``tinct lineage``: SQL over the lineage tables and a model's history.

Only the standard library is imported at module level so ``tinct --help`` stays fast.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any, TextIO

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


def _print(table: Any, fmt: str, out: TextIO) -> None:
    rows: list[dict[str, Any]] = table.to_pylist()
    names: list[str] = list(table.column_names)
    if fmt == "json":
        json.dump(
            [
                {
                    k: (dict(v) if isinstance(v, list) and v and isinstance(v[0], tuple) else v)
                    for k, v in r.items()
                }
                for r in rows
            ],
            out,
            default=str,
            indent=2,
        )
        out.write("\n")
        return
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(names)
        writer.writerows([[_cell(r[n]) for n in names] for r in rows])
        return
    cells = [[_cell(r[n]) for n in names] for r in rows]
    widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
    out.write("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip() + "\n")
    for c in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip() + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def _run(args: argparse.Namespace, produce: Callable[[], Any]) -> int:
    """Print what ``produce`` returns; 2 for a refused query, 1 for any other failure."""
    from tinct.lineage.sql import NotAQueryError

    try:
        table = produce()
    except NotAQueryError as exc:
        print(f"tinct lineage {args.lineage_command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"tinct lineage {args.lineage_command}: {exc}", file=sys.stderr)
        return 1
    _print(table, args.format, sys.stdout)
    return 0


def _cmd_sql(args: argparse.Namespace) -> int:
    from tinct.lineage.sql import query

    def produce() -> Any:
        as_of = datetime.fromisoformat(args.as_of) if args.as_of else None
        return query(args.query, _root(args), as_of_version=args.as_of_version, as_of=as_of)

    return _run(args, produce)


def _cmd_show(args: argparse.Namespace) -> int:
    from tinct.lineage.sql import history

    return _run(args, lambda: history(args.model, _root(args)))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        help=f"root URI of the lineage tables (env {ENV}, default {DEFAULT_ROOT})",
    )
    p.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output format")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lineage",
        help="query the lineage tables (model_versions, artifacts, release_events)",
        description="Read-only SQL (DataFusion) over the Delta lineage tables.",
    )
    lsub = p.add_subparsers(dest="lineage_command", metavar="COMMAND", required=True)
    q = lsub.add_parser("sql", help="run a read-only SQL query over all three tables")
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
    s = lsub.add_parser("show", help="print the recorded history of one model")
    s.add_argument("model", help="spec.model of the ModelVersions, e.g. llama3-8b")
    _common(s)
    s.set_defaults(func=_cmd_show)
