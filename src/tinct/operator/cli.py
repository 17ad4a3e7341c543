"""``tinct operator``: run the kopf operator with tinct's handlers.

The flags lay themselves over :meth:`OperatorConfig.from_env` (each has a ``TINCT_*``
variable) and the resulting config reaches the handlers through kopf's memo
(:mod:`tinct.operator.context`); the process environment is left as it was.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["HANDLER_MODULES", "register"]

#: Modules whose import registers kopf handlers; the operator loads them all.
HANDLER_MODULES = ["tinct.operator.modelversion", "tinct.operator.grayrelease.handler"]


def _cmd_operator(args: argparse.Namespace) -> int:
    import dataclasses
    import importlib

    import kopf

    from tinct.operator import context
    from tinct.operator.settings import OperatorConfig

    try:
        config = OperatorConfig.from_env().with_flags(vars(args))
    except ValueError as exc:
        print(f"tinct operator: {exc}", file=sys.stderr)
        return 2
    if args.s3_endpoint:
        config = dataclasses.replace(
            config, storage=dataclasses.replace(config.storage, s3_endpoint=args.s3_endpoint)
        )
    namespaces = args.namespace or []
    from tinct.kubeconfig import choose, preflight, use

    use(args.kubeconfig, args.context)
    # A kubeconfig or API server that cannot work is said once, and the process ends: kopf
    # would otherwise retry its login every minute without a word a person reads.
    version = preflight()
    print(f"tinct operator: {choose()}: API server {version}", file=sys.stderr)
    _check_prometheus(config)
    refused = _check_lineage(config)
    if refused is not None:
        return refused
    try:
        config.seal_key()
    except ValueError as exc:
        print(f"tinct operator: {exc}", file=sys.stderr)
        return 2
    if config.peering:
        from tinct.operator.peering import PeeringError, ensure_peering

        try:
            ensure_peering(config.peering, namespaces)
        except PeeringError as exc:
            print(f"tinct operator: {exc}", file=sys.stderr)
            return 2
    for module in HANDLER_MODULES:
        importlib.import_module(module)
    # kopf's format at INFO, each object's lines prefixed [namespace/name]: handling, peering
    # (pausing, resuming) and Events show in the log.
    kopf.configure(log_prefix=True)
    kopf.run(
        standalone=config.peering is None,
        peering_name=config.peering,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=args.liveness,
        memo=context.memo_for(config),
    )
    return 0


def _check_lineage(config: Any) -> int | None:
    """The exit status when the lineage store may not be written: 2 for a store that lets a
    second commit of a table version replace the first (unless this is the only writer), 1
    when the store cannot be checked; None when it may."""
    if config.lineage_single_writer:
        print(
            f"tinct operator: single writer: the store under {config.lineage_root} is not checked for "
            "conditional writes; run no other replica",
            file=sys.stderr,
        )
        return None
    from tinct.lineage.commits import check_commits
    from tinct.lineage.errors import LineageError, UnsafeStoreError

    try:
        check_commits(config.lineage_root, config.storage)
    except LineageError as exc:
        print(f"tinct operator: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UnsafeStoreError) else 1
    return None


def _check_prometheus(config: Any) -> None:
    """Say at start which configured Prometheus does not answer; analyses wait for it."""
    import urllib.error
    import urllib.request

    servers = ([("default", config.prometheus_url)] if config.prometheus_url else []) + list(
        config.prometheus
    )
    for name, url in servers:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=3) as r:
                r.read(256)
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", None) or exc
            print(
                f"tinct operator: Prometheus {name} at {url} does not answer ({reason}); analyses "
                "reading it are inconclusive until it does",
                file=sys.stderr,
            )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tinct.kubeconfig import add_flags

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
    add_flags(p)
    # Each dest is the name of an OperatorConfig field; parsing and checks live there.
    p.add_argument("--lineage-root", help="root URI of the lineage tables (TINCT_LINEAGE_ROOT)")
    p.add_argument(
        "--lineage-single-writer",
        action="store_true",
        default=None,
        help="this is the only replica writing the lineage tables: accept a store without conditional "
        "writes, which is refused otherwise (TINCT_LINEAGE_SINGLE_WRITER)",
    )
    p.add_argument("--hash-workers", help="threads hashing artifacts (TINCT_HASH_WORKERS)")
    p.add_argument(
        "--artifact-root",
        dest="artifact_roots",
        metavar="DIR",
        action="append",
        help="directory file:// artifacts may be read from (repeatable; TINCT_ARTIFACT_ROOTS, "
        "':'-separated). Without one, file:// artifacts are refused",
    )
    p.add_argument("--s3-endpoint", help="S3-compatible endpoint, e.g. http://minio:9000 (TINCT_S3_ENDPOINT)")
    p.add_argument("--peering", help="kopf peering name: enables leader election (TINCT_PEERING)")
    p.add_argument(
        "--peering-priority",
        type=int,
        help="this replica's peering priority; the highest acts, equal ones all freeze "
        "(TINCT_PEERING_PRIORITY; default: from the start time, the oldest replica acts)",
    )
    p.add_argument(
        "--peering-lifetime",
        help="seconds a peer counts as alive after its last keep-alive (TINCT_PEERING_LIFETIME, 60)",
    )
    p.add_argument(
        "--metrics-port", type=int, help="serve operator metrics on this port (TINCT_METRICS_PORT)"
    )
    p.add_argument(
        "--release-tick",
        type=float,
        help="seconds between GrayRelease precondition checks (TINCT_RELEASE_TICK)",
    )
    p.add_argument(
        "--table-namespace",
        help="namespace of the routing tables, which only the operator may write and the routers read "
        "(TINCT_TABLE_NAMESPACE; default: the operator's own namespace)",
    )
    p.add_argument(
        "--prometheus-url",
        metavar="URL",
        help="Prometheus a GrayRelease analysis reads when it names none (TINCT_PROMETHEUS_URL)",
    )
    p.add_argument(
        "--prometheus",
        metavar="NAME=URL",
        action="append",
        help="another Prometheus a GrayRelease may name by spec.analysis.prometheus.name or URL "
        "(repeatable; TINCT_PROMETHEUS, ','-separated). A release naming a Prometheus the operator "
        "is not given is refused",
    )
    p.add_argument(
        "--prometheus-timeout",
        metavar="SECONDS",
        help="seconds one Prometheus query may take (TINCT_PROMETHEUS_TIMEOUT, 5)",
    )
    p.add_argument(
        "--notifier",
        dest="notifiers",
        metavar="NAME=TYPE:URL",
        action="append",
        help="a webhook releases may name in spec.notify: TYPE json, slack or cloudevents; URL may be "
        "env:VARIABLE (repeatable; TINCT_NOTIFIERS, ','-separated)",
    )
    p.add_argument("--notify-timeout", help="seconds one webhook post may take (TINCT_NOTIFY_TIMEOUT, 5)")
    p.add_argument(
        "--notify-attempts", help="posts of one notification before it is given up (TINCT_NOTIFY_ATTEMPTS, 6)"
    )
    p.add_argument(
        "--notify-backoff",
        help="seconds before the first retry of a post, doubling after each (TINCT_NOTIFY_BACKOFF, 1)",
    )
    p.add_argument(
        "--notify-break-after",
        help="failed posts in a row after which a webhook's circuit breaker opens: its notifications "
        "are dropped (and counted) until one is tried again (TINCT_NOTIFY_BREAK_AFTER, 3)",
    )
    p.add_argument(
        "--notify-retry-after",
        help="seconds an open circuit breaker waits before one post is tried again "
        "(TINCT_NOTIFY_RETRY_AFTER, 30)",
    )
    p.add_argument(
        "--allow-backend",
        dest="allow_backends",
        metavar="HOST|CIDR",
        action="append",
        help="a host (api.example.com, *.shared.svc.cluster.local) or address range a release's "
        "backend url may name besides its own namespace's Services (repeatable; "
        "TINCT_ALLOW_BACKENDS, ','-separated). Give the routers the same",
    )
    p.add_argument(
        "--model-owner",
        dest="model_owners",
        metavar="MODEL=NAMESPACE",
        action="append",
        help="the namespace whose releases alone may serve MODEL on the shared routers, whichever "
        "routed it first (repeatable; TINCT_MODEL_OWNERS, ','-separated). Give the routers the same",
    )
    p.add_argument(
        "--status-key-file",
        metavar="FILE",
        help="file holding the key GrayRelease statuses are sealed with; give every replica the "
        "same (TINCT_STATUS_KEY_FILE; TINCT_STATUS_KEY holds the key itself). Default: a key of "
        "this process alone",
    )
    p.add_argument("--cluster-domain", help="DNS suffix of Services in routing tables (TINCT_CLUSTER_DOMAIN)")
    p.add_argument("--liveness", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.set_defaults(func=_cmd_operator)
