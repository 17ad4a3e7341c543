"""``tinct router``: serve OpenAI-style traffic by the routing table.

Every default comes from :class:`~tinct.router.config.RouterConfig`, so the command, the
library and the docs cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tinct.api.backends import BackendPolicy, parse_allowed
from tinct.api.ownership import parse_model_owners
from tinct.router.config import RouterConfig

__all__ = ["config_from_args", "register"]

_D = RouterConfig()


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """The :class:`RouterConfig` the parsed flags describe: a flag named as a field gives it as
    parsed; the others are converted here."""
    given = vars(args)
    same = {f.name: given[f.name] for f in dataclasses.fields(RouterConfig) if f.name in given}
    converted = {
        "table_files": tuple(Path(t) for t in args.table or ()),
        "kubeconfig": Path(args.kubeconfig) if args.kubeconfig else None,
        "trust_role_from": tuple(args.trust_role_from),
        "pass_through_prefixes": tuple(args.pass_through_prefix or _D.pass_through_prefixes),
        "allow_backends": parse_allowed(args.allow_backend),
        "model_owners": tuple(args.model_owner),
        "resolve": tuple(args.resolve or ()),
        "workers": _workers(args),
        "measure_tokens": not args.no_token_metrics,
        "comparer": args.comparer or None,
        "comparer_token_file": Path(args.comparer_token_file) if args.comparer_token_file else None,
        "keepalive_timeout": args.upstream_idle_timeout,
    }
    return RouterConfig(**{**same, **converted})


def _check_comparer(args: argparse.Namespace) -> None:
    """The comparer's URL and token file, as a user can act on them.

    Raises:
        ValueError: the URL is not http(s), or the token file cannot be read or is empty.
    """
    if not args.comparer:
        return
    from tinct.router.pairs import Destination

    Destination.parse(args.comparer)
    if args.comparer_token_file:
        try:
            text = Path(args.comparer_token_file).read_text().strip()
        except OSError as e:
            raise ValueError(
                f"--comparer-token-file {args.comparer_token_file}: cannot read it: {e.strerror or e}"
            ) from None
        if not text:
            raise ValueError(f"--comparer-token-file {args.comparer_token_file} is empty")


def _workers(args: argparse.Namespace) -> int:
    if args.workers is not None:
        return int(args.workers)
    if args.metrics_port is None:
        return 1  # the workers' metrics can only be summed on a metrics port
    from tinct.router.workers import cpu_limit

    return cpu_limit()


def _cmd_router(args: argparse.Namespace) -> int:
    import logging

    from tinct.router.run import run
    from tinct.router.trust import RoleTrust

    who = "%(name)s" if args.worker_of is None else "%(name)s[%(process)d]"  # which worker
    logging.basicConfig(level=args.log_level.upper(), format=f"%(asctime)s %(levelname)s {who}: %(message)s")
    if args.worker_of is not None:
        from tinct.router.workers import config_from_json, die_with_parent

        if not die_with_parent(args.worker_of):
            return 1  # the parent is gone already
        run(config_from_json(args.worker_config))
        return 0
    if not args.table and not args.watch:
        print("tinct router: give --table FILE or --watch", file=sys.stderr)
        return 2
    try:
        RoleTrust(args.trust_role_from)
        parse_allowed(args.allow_backend)
        parse_model_owners(args.model_owner)
        from tinct.router.app import parse_resolve
        from tinct.router.paths import PassThrough

        parse_resolve(args.resolve or ())
        PassThrough(args.pass_through_prefix or ())
        _check_comparer(args)
    except ValueError as e:
        print(f"tinct router: {e}", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers > 1 and args.metrics_port is None:
        print(
            "tinct router: --workers above 1 needs --metrics-port, where the workers' metrics "
            "are summed and their readiness is reported",
            file=sys.stderr,
        )
        return 2
    config = config_from_args(args)
    if config.watch:
        from tinct.kubeconfig import preflight, use

        use(config.kubeconfig, config.context)
        preflight()
    if config.workers > 1:
        from tinct.router.workers import supervise

        return supervise(config, args.log_level)
    run(config)
    return 0


def _listed(variable: str) -> list[str]:
    """The ``,``-separated items of an environment variable: a repeatable flag's default."""
    return [x for x in os.environ.get(variable, "").split(",") if x]


def add_backend_flags(p: argparse.ArgumentParser, *, same: str) -> None:
    """``--allow-backend`` and ``--cluster-domain``: the backends a watched table may name
    (:class:`~tinct.api.backends.BackendPolicy`); ``same``: who is to be given the same."""
    p.add_argument(
        "--allow-backend",
        metavar="HOST|CIDR",
        action="append",
        default=_listed("TINCT_ALLOW_BACKENDS"),
        help="with --watch: a host (api.example.com, *.shared.svc.cluster.local) or address range a "
        "table's backend may be besides its release's namespace's Services; a table naming "
        f"anything else is refused (repeatable; env TINCT_ALLOW_BACKENDS, comma-separated; give {same} "
        "the same)",
    )
    p.add_argument(
        "--cluster-domain",
        default=os.environ.get("TINCT_CLUSTER_DOMAIN") or BackendPolicy().cluster_domain,
        help="with --watch: the cluster's DNS domain, of <service>.<namespace>.svc.<domain> "
        "(env TINCT_CLUSTER_DOMAIN; default: %(default)s)",
    )


def _whole_number(least: int) -> Callable[[str], int]:
    """The argparse type of a whole number of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {least}, not {text!r}")
        return value

    return parse


_positive_int = _whole_number(1)
_count = _whole_number(0)


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tinct.kubeconfig import add_flags

    p = sub.add_parser(
        "router",
        help="run the dye router: classify, choose stable/candidate, proxy, fall back",
        description="Serve OpenAI-style traffic, routing each dye cell between stable and candidate "
        "by the routing table from --table FILE or from ConfigMaps watched with --watch.",
    )
    p.add_argument(
        "--table",
        metavar="FILE",
        action="append",
        help="routing table JSON; re-read on change and on SIGHUP (repeatable: one table per "
        "release, picked by the request's model)",
    )
    p.add_argument("--watch", action="store_true", help="watch routing-table ConfigMaps through the API")
    p.add_argument("--namespace", help="with --watch: namespace to watch (default: all namespaces)")
    p.add_argument(
        "--selector", default=_D.selector, help="with --watch: label selector (default: %(default)s)"
    )
    add_flags(p, what="with --watch: ")
    p.add_argument(
        "--default-release",
        metavar="NAME",
        help="release whose table takes requests that name no model, as NAME or NAMESPACE/NAME "
        "(default: the oldest table)",
    )
    p.add_argument(
        "--resolve",
        metavar="HOST:PORT=ADDRESS:PORT",
        action="append",
        help="connect to ADDRESS:PORT for a backend the table names HOST:PORT (its Host header stays), "
        "as curl --resolve does: for a router outside the cluster, where Service names do not "
        "resolve (repeatable)",
    )
    p.add_argument("--host", default=_D.host, help="listen address (default: %(default)s)")
    p.add_argument("--port", type=int, default=_D.port, help="listen port (default: %(default)s)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=_D.metrics_port,
        help="serve /metrics, /healthz and /readyz on this port instead of the proxy port, where "
        "those paths then go to stable like any other (default: on the proxy port)",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="worker processes sharing the proxy port (SO_REUSEPORT); their metrics are summed "
        "and their readiness reported on --metrics-port, which more than one worker needs. "
        "1: a single process, no workers. Default: with --metrics-port, the CPU limit (the "
        "cgroup CPU quota rounded up, else the CPUs this process may run on); without, 1",
    )
    p.add_argument("--worker-of", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker-config", help=argparse.SUPPRESS)
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=_D.max_body_bytes,
        help="classified request bodies over this get a 413 (default: %(default)s)",
    )
    p.add_argument(
        "--head-timeout",
        type=_seconds,
        default=_D.head_timeout,
        help="seconds a request head may take to arrive; slower clients are closed (default: %(default)s)",
    )
    p.add_argument(
        "--body-timeout",
        type=_seconds,
        default=_D.body_timeout,
        help="seconds a classified request body may take to arrive whole, and the longest pause in "
        "a streamed one; slower clients get a 408 and are closed (default: %(default)s)",
    )
    p.add_argument(
        "--upstream-head-timeout",
        type=_seconds,
        default=_D.upstream_head_timeout,
        help="seconds until stable's response head must be in, else the client gets a 502; "
        "generous, as a non-streamed answer sends its head only when generation ends (the "
        "candidate has the table's fallback.latencyMs) (default: %(default)s)",
    )
    p.add_argument(
        "--upstream-keepalive",
        type=_count,
        metavar="N",
        default=_D.upstream_keepalive,
        help="idle keep-alive connections to each backend kept per process (each worker), as "
        "nginx's upstream keepalive; more are closed as they come back, so a burst of streams "
        "leaves no more than this open once it ends (0: none kept) (default: %(default)s)",
    )
    p.add_argument(
        "--upstream-idle-timeout",
        type=_seconds,
        metavar="SECONDS",
        default=_D.keepalive_timeout,
        help="seconds an idle keep-alive connection to a backend is kept; keep it under the "
        "backends' own keep-alive timeout (uvicorn's is 5 s) (default: %(default)s)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=_D.shutdown_timeout,
        help="grace period on SIGTERM: seconds requests in flight get to finish; connections that "
        "are idle or still sending their request are closed at once (default: %(default)s)",
    )
    p.add_argument(
        "--trust-role-from",
        metavar="CIDR",
        action="append",
        default=_listed("TINCT_ROUTER_TRUST_ROLE_FROM"),
        help="believe the dye role header only from these peers, e.g. the gateway's range "
        "(repeatable; env TINCT_ROUTER_TRUST_ROLE_FROM, comma-separated). Default: nobody, "
        "every caller gets the default role",
    )
    p.add_argument(
        "--pass-through-prefix",
        metavar="PATH",
        action="append",
        default=_listed("TINCT_ROUTER_PASS_THROUGH_PREFIX") or None,
        help="pass requests whose path is under PATH through to stable, unclassified; any other "
        "path (besides POST /v1/chat/completions and /v1/completions, always classified) gets a "
        "404. PATH ending in / takes every path under it, one without takes itself and what is "
        "under it (repeatable; env TINCT_ROUTER_PASS_THROUGH_PREFIX, comma-separated). "
        f"Default: {' '.join(_D.pass_through_prefixes)}",
    )
    add_backend_flags(p, same="the operator")
    p.add_argument(
        "--model-owner",
        metavar="MODEL=NAMESPACE",
        action="append",
        default=_listed("TINCT_MODEL_OWNERS"),
        help="the namespace whose tables alone serve MODEL, whichever routed it first (repeatable; "
        "env TINCT_MODEL_OWNERS, comma-separated; give the operator the same). Default: a model "
        "belongs to the namespace that first routed it",
    )
    p.add_argument(
        "--no-token-metrics",
        action="store_true",
        help="do not read classified answers for the token metrics (time to first token, "
        "inter-token latency, output tokens, contract violations); their families stay empty",
    )
    shadow = p.add_argument_group(
        "mirroring",
        "Requests stable answers in a cell with a shadow share (the routing table's cells[].shadow) "
        "are mirrored to the candidate, and both answers sent as pairs to tinct comparer.",
    )
    shadow.add_argument(
        "--comparer",
        metavar="URL",
        default=os.environ.get("TINCT_ROUTER_COMPARER") or None,
        help="base URL of tinct comparer (pairs go to URL/v1/pairs), e.g. http://tinct-comparer:8090 "
        "(env TINCT_ROUTER_COMPARER). Without it nothing is mirrored",
    )
    shadow.add_argument(
        "--comparer-token-file",
        metavar="FILE",
        default=os.environ.get("TINCT_ROUTER_COMPARER_TOKEN_FILE") or None,
        help="file holding the bearer token the comparer expects, re-read when it changes (env "
        "TINCT_ROUTER_COMPARER_TOKEN_FILE). Default: the token in TINCT_COMPARER_TOKEN, else none",
    )
    shadow.add_argument(
        "--comparer-queue",
        metavar="N",
        type=_positive_int,
        # a string default goes through type=, so a bad variable is a usage error
        default=os.environ.get("TINCT_ROUTER_COMPARER_QUEUE") or _D.comparer_queue,
        help="pairs each worker queues for the comparer at most; more are dropped and counted "
        "(env TINCT_ROUTER_COMPARER_QUEUE; default: %(default)s)",
    )
    shadow.add_argument(
        "--shadow-max-held-bytes",
        metavar="BYTES",
        type=_positive_int,
        default=os.environ.get("TINCT_ROUTER_SHADOW_MAX_HELD_BYTES") or _D.shadow_max_held_bytes,
        help="bytes each worker holds for pairs at most: a mirror in flight reserves its request "
        "body and twice the release's shadow.maxBytes, a queued pair its size; past it requests "
        "are not mirrored (budget) (env TINCT_ROUTER_SHADOW_MAX_HELD_BYTES; default: %(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_cmd_router)
