"""The ``tinct`` command.

Each subcommand registers its parser and sets ``func``: the small ones here
(``_add_<name>``), the others from their package's ``cli`` module (``register``, through
``_add_packages``). Heavy imports happen inside the handlers so ``tinct --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

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


def _cmd_version(args: argparse.Namespace) -> int:
    import platform

    info = {"tinct": __version__, "python": platform.python_version()}
    try:
        from importlib.metadata import version

        info["kopf"] = version("kopf")
    except Exception:  # an install without kopf's metadata still has a version to show
        info["kopf"] = "unknown"
    if args.output == "json":
        import json

        print(json.dumps(info))
    else:
        print(f"tinct {info['tinct']} (python {info['python']}, kopf {info['kopf']})")
    return 0


def _add_version(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("version", help="print tinct's version", description="Print the version of tinct.")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format")
    p.set_defaults(func=_cmd_version)


def _cmd_completion(args: argparse.Namespace) -> int:
    from tinct.completion import SCRIPTS

    sys.stdout.write(SCRIPTS[args.shell])
    return 0


def _add_completion(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script: source <(tinct completion bash)",
        description="Print the completion script of a shell. bash: source <(tinct completion bash); "
        "zsh: source <(tinct completion zsh); fish: tinct completion fish | source. It completes "
        "commands, flags, their values, and GrayRelease names and namespaces from the cluster. "
        "kubectl completes kubectl tinct by itself through the installed kubectl_complete-tinct.",
    )
    p.add_argument("shell", choices=["bash", "zsh", "fish"])
    p.set_defaults(func=_cmd_completion)


def _cmd_complete(args: argparse.Namespace) -> int:
    from tinct.completion import complete

    for candidate in complete(args.words, build_parser()):
        print(candidate)
    return 0


def _add_complete(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # The completion scripts' helper: not listed in --help.
    p = sub.add_parser("__complete")
    p.add_argument("words", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_complete)


def _add_crds(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "crds",
        help="write the CustomResourceDefinitions generated from the API models",
        description="Write one CRD YAML per kind, generated from the pydantic models in tinct.api.",
    )
    p.add_argument("--out", default="crds", help="directory to write into (default: %(default)s)")
    p.add_argument("--stdout", action="store_true", help="print all CRDs as one YAML stream instead")
    p.set_defaults(func=_cmd_crds)


def _add_packages(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands whose parsers live in their own package's ``cli`` module."""
    from tinct.emulator.cli import register as emulator
    from tinct.lineage.cli import register as lineage
    from tinct.operator.cli import register as operator
    from tinct.release.cli import register as release
    from tinct.router.cli import register as router
    from tinct.shadow.cli import register as comparer

    for register in (router, operator, lineage, release, comparer, emulator):
        register(sub)


#: Subcommand registrars, in the order ``tinct --help`` lists them.
COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_crds,
    _add_packages,
    _add_version,
    _add_completion,
    _add_complete,
]


def _with_exit_status(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every subcommand's parser the exit statuses in its ``--help``."""
    from tinct.clierrors import EXIT_STATUS_HELP

    if parser.epilog is None:
        parser.epilog = EXIT_STATUS_HELP
        if parser.formatter_class is argparse.HelpFormatter:
            parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _with_exit_status(child)


def build_parser(prog: str = "tinct") -> argparse.ArgumentParser:
    description = "ML model version lineage and per-dye-cell gray release on Kubernetes."
    if prog != "tinct":
        description += (
            f" As {prog}, a first word that is a release verb is a release command: "
            f"{prog} status chat --watch runs tinct release status chat --watch."
        )
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"tinct {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    _with_exit_status(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "tinct") -> int:
    from tinct.clierrors import INTERRUPTED, run

    try:  # building the parser imports the commands' modules: Ctrl-C may come meanwhile
        parser = build_parser(prog)
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return run(f"tinct {args.command}", lambda: func(args))


def entry() -> NoReturn:
    """The ``tinct`` command: :func:`main`, and its exit status.

    Interrupted, the process leaves at once once its output is flushed: the interpreter's
    shutdown would wait on the native threads of a query Ctrl-C has just dropped (DataFusion's
    runtime), and a signal they still deliver would end the process as killed instead of 130.
    """
    from tinct.clierrors import INTERRUPTED

    code = main()
    if code == INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
