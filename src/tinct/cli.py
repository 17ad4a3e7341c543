"""The ``tinct`` command.

Each subcommand is one ``_add_<name>`` function that registers its parser and sets
``func``; heavy imports happen inside the handlers so ``tinct --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tinct import __version__


def _cmd_crds(args: argparse.Namespace) -> int:
    from tinct.api.crd import render, write_all
    from tinct.api.v1alpha1 import RESOURCES

    if args.stdout:
        sys.stdout.write("---\n".join(render(r) for r in RESOURCES))
        return 0
    for path in write_all(Path(args.out), RESOURCES):
        print(path)
    return 0


def _add_crds(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "crds",
        help="write the CustomResourceDefinitions generated from the API models",
        description="Write one CRD YAML per kind, generated from the pydantic models in tinct.api.",
    )
    p.add_argument("--out", default="crds", help="directory to write into (default: %(default)s)")
    p.add_argument("--stdout", action="store_true", help="print all CRDs as one YAML stream instead")
    p.set_defaults(func=_cmd_crds)


def _cmd_router(args: argparse.Namespace) -> int:
    import logging

    from tinct.router.app import RouterConfig
    from tinct.router.run import run
    from tinct.router.trust import RoleTrust

    if not args.table and not args.watch:
        print("tinct router: give --table FILE or --watch", file=sys.stderr)
        return 2
    try:
        RoleTrust(args.trust_role_from)
    except ValueError as e:
        print(f"tinct router: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(
        RouterConfig(
            host=args.host,
            port=args.port,
            max_body_bytes=args.max_body_bytes,
            shutdown_timeout=args.shutdown_timeout,
            table_file=Path(args.table) if args.table else None,
            watch=args.watch,
            namespace=args.namespace,
            selector=args.selector,
            kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
            trust_role_from=tuple(args.trust_role_from),
        )
    )
    return 0


def _add_router(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "router",
        help="run the dye router: classify, choose stable/candidate, proxy, fall back",
        description="Serve OpenAI-style traffic, routing each dye cell between stable and candidate "
        "by the routing table from --table FILE or from ConfigMaps watched with --watch.",
    )
    p.add_argument("--table", metavar="FILE", help="routing table JSON; re-read on change and on SIGHUP")
    p.add_argument("--watch", action="store_true", help="watch routing-table ConfigMaps through the API")
    p.add_argument("--namespace", help="with --watch: namespace to watch (default: all namespaces)")
    p.add_argument(
        "--selector",
        default="tinct.io/routing-table=true",
        help="with --watch: label selector (default: %(default)s)",
    )
    p.add_argument("--kubeconfig", help="with --watch: kubeconfig (default: in-cluster or $KUBECONFIG)")
    p.add_argument("--host", default="0.0.0.0", help="listen address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="listen port (default: %(default)s)")
    p.add_argument(
        "--max-body-bytes", type=int, default=4 * 1024 * 1024, help="413 above this (default: %(default)s)"
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds to let streams finish (default: %(default)s)",
    )
    p.add_argument(
        "--trust-role-from",
        metavar="CIDR",
        action="append",
        default=[x for x in os.environ.get("TINCT_ROUTER_TRUST_ROLE_FROM", "").split(",") if x],
        help="believe the dye role header only from these peers, e.g. the gateway's range "
        "(repeatable; env TINCT_ROUTER_TRUST_ROLE_FROM, comma-separated). Default: nobody, "
        "every caller gets the default role",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_cmd_router)


def _add_operator(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tinct.operator.cli import register

    register(sub)


def _add_lineage(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tinct.lineage.cli import register

    register(sub)


def _add_release(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tinct.release.cli import register

    register(sub)


#: Subcommand registrars, in the order ``tinct --help`` lists them.
COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_crds,
    _add_router,
    _add_operator,
    _add_lineage,
    _add_release,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tinct",
        description="ML model version lineage and per-dye-cell gray release on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"tinct {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
