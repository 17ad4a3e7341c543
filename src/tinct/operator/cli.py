"""``tinct operator``: run the kopf operator with tinct's handlers.

Flags become the ``TINCT_*`` environment variables :mod:`tinct.operator.settings`
reads, so ``kopf run -m tinct.operator.modelversion`` and this command behave the same.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["HANDLER_MODULES", "register"]

#: Modules whose import registers kopf handlers; the operator loads them all.
HANDLER_MODULES = ["tinct.operator.modelversion", "tinct.operator.grayrelease"]


def _cmd_operator(args: argparse.Namespace) -> int:
    import importlib

    import kopf

    env = {
        "TINCT_LINEAGE_ROOT": args.lineage_root,
        "TINCT_HASH_WORKERS": str(args.hash_workers) if args.hash_workers else None,
        "TINCT_S3_ENDPOINT": args.s3_endpoint,
        "TINCT_PEERING": args.peering,
        "TINCT_METRICS_PORT": str(args.metrics_port) if args.metrics_port else None,
        "TINCT_RELEASE_TICK": str(args.release_tick) if args.release_tick else None,
        "TINCT_CLUSTER_DOMAIN": args.cluster_domain,
    }
    for key, value in env.items():
        if value:
            os.environ[key] = value
    namespaces = args.namespace or []
    if args.peering:
        from tinct.operator.peering import PeeringError, ensure_peering

        try:
            ensure_peering(args.peering, namespaces)
        except PeeringError as exc:
            print(f"tinct operator: {exc}", file=sys.stderr)
            return 2
    for module in HANDLER_MODULES:
        importlib.import_module(module)
    kopf.run(
        standalone=args.peering is None,
        peering_name=args.peering,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=args.liveness,
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "operator",
        help="run the operator (ModelVersion lifecycle and lineage, GrayRelease controller)",
        description="Run the tinct operator. Each flag has a TINCT_* environment variable.",
    )
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="namespace to watch (repeatable; globs allowed); default: the whole cluster",
    )
    p.add_argument("--lineage-root", help="root URI of the lineage tables (TINCT_LINEAGE_ROOT)")
    p.add_argument("--hash-workers", type=int, help="threads hashing artifacts (TINCT_HASH_WORKERS)")
    p.add_argument("--s3-endpoint", help="S3-compatible endpoint, e.g. http://minio:9000 (TINCT_S3_ENDPOINT)")
    p.add_argument("--peering", help="kopf peering name: enables leader election (TINCT_PEERING)")
    p.add_argument(
        "--metrics-port", type=int, help="serve operator metrics on this port (TINCT_METRICS_PORT)"
    )
    p.add_argument(
        "--release-tick",
        type=float,
        help="seconds between GrayRelease precondition checks (TINCT_RELEASE_TICK)",
    )
    p.add_argument("--cluster-domain", help="DNS suffix of Services in routing tables (TINCT_CLUSTER_DOMAIN)")
    p.add_argument("--liveness", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.set_defaults(func=_cmd_operator, peering=os.environ.get("TINCT_PEERING"))
