"""``tinct comparer``: compare the answers of mirrored requests, count and record the verdicts.

Every flag has a ``TINCT_COMPARER_*`` variable (the flag wins) but ``--allow-backend`` and
``--cluster-domain``, whose variables the operator and the routers share
(``TINCT_ALLOW_BACKENDS``, ``TINCT_CLUSTER_DOMAIN``); defaults come from
:class:`~tinct.shadow.service.ComparerConfig`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["config_from_args", "register"]

_DESCRIPTION = """\
Take the pairs routers send (a mirrored request, stable's answer and the candidate's) on
POST /v1/pairs, compare them -- API structure, tool calls, text -- and, for a sample of the
differences, ask an LLM judge if the release names one. Export the verdicts on /metrics
(tinct_shadow_pairs_total, which the shadow-agreement analysis metric reads) and record them
in the shadow_pairs lineage table. Pairs are refused unless a routing table with a shadow
share (--table FILE, or ConfigMaps with --watch) names their release, uid and dye tag.
"""


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TINCT_COMPARER_{name}", default)


def _judge(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"give NAME=URL with an http(s) URL, not {text!r}")
    return name, url


def _token(args: argparse.Namespace) -> str | None:
    """The token from --comparer-token-file, else $TINCT_COMPARER_TOKEN."""
    if args.token_file:
        try:
            text = Path(args.token_file).read_text().strip()
        except OSError as e:
            raise ValueError(f"cannot read the token file {args.token_file}: {e.strerror}") from None
        if not text:
            raise ValueError(f"the token file {args.token_file} is empty")
        return text
    return os.environ.get("TINCT_COMPARER_TOKEN") or None


def config_from_args(args: argparse.Namespace) -> object:
    from tinct.api.backends import parse_allowed
    from tinct.lineage.root import lineage_root
    from tinct.shadow.service import ComparerConfig
    from tinct.text import listed

    judges = dict(args.judge or [])
    for item in listed(_env("JUDGES") or ""):
        judges.setdefault(*_judge(item))
    return ComparerConfig(
        host=args.host,
        port=args.port,
        token=_token(args),
        insecure_no_token=args.insecure_no_token,
        table_files=tuple(Path(t) for t in args.table or ()),
        watch=args.watch,
        namespace=args.namespace,
        selector=args.selector,
        kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
        context=args.context,
        lineage_root=None if args.no_lineage else lineage_root(args.lineage_root),
        queue_size=args.queue_size,
        batch_rows=args.batch_rows,
        judges=judges,
        judge_concurrency=args.judge_concurrency,
        judge_per_minute=args.judge_per_minute,
        allow_backends=parse_allowed(args.allow_backend),
        cluster_domain=args.cluster_domain,
    )


def _cmd(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib
    import logging
    import signal

    from tinct.shadow.service import ComparerConfig, serving

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("tinct.comparer")
    if not args.table and not args.watch:
        print(
            "tinct comparer: give --table FILE or --watch: pairs are taken only for tables", file=sys.stderr
        )
        return 2
    try:
        config = config_from_args(args)
    except (ValueError, argparse.ArgumentTypeError) as e:
        print(f"tinct comparer: {e}", file=sys.stderr)
        return 2
    assert isinstance(config, ComparerConfig)
    if config.token is None and not config.insecure_no_token:
        print(
            "tinct comparer: no token: give --comparer-token-file FILE (or TINCT_COMPARER_TOKEN), the "
            "token the routers send; --insecure-no-token takes pairs from anyone who can reach the port",
            file=sys.stderr,
        )
        return 2
    if config.watch:
        from tinct.kubeconfig import preflight, use

        use(config.kubeconfig, config.context)
        preflight()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with serving(config) as c:
            log.info(
                "comparing pairs on %s/v1/pairs; %s; judges: %s",
                c.url,
                f"recording to {config.lineage_root}/shadow_pairs"
                if config.lineage_root
                else "not recording",
                ", ".join(sorted(config.judges)) or "none",
            )
            await stop.wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tinct.kubeconfig import add_flags
    from tinct.router.cli import _positive_int as _positive
    from tinct.router.cli import add_backend_flags
    from tinct.shadow.service import ComparerConfig

    d = ComparerConfig()

    def count(parser: argparse.ArgumentParser, flag: str, text: str) -> None:
        """A positive whole number ``--a-b``: TINCT_COMPARER_A_B, else the configuration's."""
        name = flag.removeprefix("--").replace("-", "_")
        default = int(_env(name.upper()) or getattr(d, name))
        parser.add_argument(flag, type=_positive, default=default, help=text)

    def switch(parser: argparse.ArgumentParser, flag: str, text: str) -> None:
        """An on/off ``--a-b``, on by default when TINCT_COMPARER_A_B is 1, true or yes."""
        on = (_env(flag.removeprefix("--").replace("-", "_").upper()) or "").lower() in ("1", "true", "yes")
        parser.add_argument(flag, action="store_true", default=on, help=text)

    p = sub.add_parser(
        "comparer",
        help="compare the answers of mirrored requests (shadow traffic) and export the agreement",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--table", metavar="FILE", action="append", help="routing table JSON (repeatable)")
    p.add_argument("--watch", action="store_true", help="follow routing-table ConfigMaps through the API")
    p.add_argument(
        "--namespace",
        default=_env("NAMESPACE"),
        help="with --watch: the table namespace (TINCT_COMPARER_NAMESPACE; default: all namespaces)",
    )
    p.add_argument(
        "--selector", default=d.selector, help="with --watch: label selector (default: %(default)s)"
    )
    add_flags(p, what="with --watch: ")
    add_backend_flags(p, same="the operator and the routers")
    p.add_argument(
        "--host",
        default=_env("HOST", d.host),
        help="listen address (TINCT_COMPARER_HOST; default: %(default)s)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(_env("PORT") or d.port),
        help="listen port of /v1/pairs and /metrics (TINCT_COMPARER_PORT; default: %(default)s)",
    )
    p.add_argument(
        "--comparer-token-file",
        "--token-file",
        dest="token_file",
        default=_env("TOKEN_FILE"),
        metavar="FILE",
        help="file holding the bearer token routers send (TINCT_COMPARER_TOKEN_FILE; or the token "
        "itself in TINCT_COMPARER_TOKEN)",
    )
    switch(
        p,
        "--insecure-no-token",
        "take pairs without a token (TINCT_COMPARER_INSECURE_NO_TOKEN): only where nothing "
        "else can reach the port",
    )
    p.add_argument(
        "--lineage-root",
        help="root of the lineage tables; pairs go to its shadow_pairs table (default: "
        "$TINCT_LINEAGE_ROOT, else /var/lib/tinct/lineage)",
    )
    switch(p, "--no-lineage", "count verdicts without recording them (TINCT_COMPARER_NO_LINEAGE)")
    count(
        p,
        "--queue-size",
        "pairs waiting to be compared; more are dropped and counted (TINCT_COMPARER_QUEUE_SIZE; "
        "default: %(default)s)",
    )
    count(
        p,
        "--batch-rows",
        "rows of shadow_pairs per commit at most; a commit also every 2 s (default: %(default)s)",
    )
    p.add_argument(
        "--judge",
        metavar="NAME=URL",
        type=_judge,
        action="append",
        help="an OpenAI-compatible judge endpoint (base URL, e.g. http://judge:8000/v1) releases may "
        "name in spec.shadow.judge.name (repeatable; TINCT_COMPARER_JUDGES, comma-separated; its API "
        "key, if any, in TINCT_JUDGE_API_KEY_<NAME>)",
    )
    count(
        p,
        "--judge-concurrency",
        "judge calls in flight at most; more are skipped and counted (budget) (default: %(default)s)",
    )
    count(p, "--judge-per-minute", "judge calls per minute at most (default: %(default)s)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_cmd)
