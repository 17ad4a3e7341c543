"""``tinct emulator``: serve an emulated LLM engine (no model runs).

One flag per field of :class:`~tinct.emulator.behaviour.Behaviour`, each with its
``TINCT_EMULATOR_*`` variable, generated from the model so the flags, the environment and
the control endpoint take the same names and bounds.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import typing
from typing import Any, get_args

__all__ = ["register"]

_DESCRIPTION = """\
Serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models) that
EMULATES an LLM serving engine: no model runs, no GPU is used, the tokens are placeholders
("Emulated answer from MODEL."). It streams Server-Sent Events or answers whole with the
configured time to first token, inter-token latency, error and rate-limit (429) shares, and
can break the OpenAI contract on purpose; requests beyond --slots wait in a queue. Its
answers can drift (a share of prompts, or prompts with a marker), carry sampling noise, be
JSON objects (response_format) with a field added or dropped, or tool calls (tools) in an
order it can change: made-up differences between two versions, for shadow comparisons. /metrics
exports the named engine's own metric names (vLLM, SGLang or TGI), so the queue depth and
KV-cache usage move with the load as theirs do; /healthz answers ok. Every answer carries the
header X-Tinct-Emulator. Each flag has an environment variable TINCT_EMULATOR_<FLAG>
(upper case, '-' as '_'); the flags win. With --control, GET/POST /emulator/config reads
or changes the behaviour at runtime (a JSON object of field names as below, with '_').
"""


def _flag_type(annotation: Any) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)]
    base = args[0] if args else annotation
    if base in (int, float, str):
        return base
    return str


def _add_fields(p: argparse.ArgumentParser) -> None:
    from tinct.emulator.behaviour import Behaviour, env_name

    hints = typing.get_type_hints(Behaviour)
    for name, info in Behaviour.model_fields.items():
        flag = "--" + name.replace("_", "-")
        env = env_name(name)
        default = info.get_default(call_default_factory=True)
        shown = (
            "none"
            if default in (None, [])
            else str(default).lower()
            if isinstance(default, bool)
            else default
        )
        helptext = f"{info.description} ({env}; default: {shown})"
        annotation = hints[name]
        choices = get_args(annotation) if typing.get_origin(annotation) is typing.Literal else None
        if annotation is bool:
            p.add_argument(flag, action="store_true", default=None, help=helptext)
        elif name == "accept_versions":
            p.add_argument(flag, metavar="VERSION", action="append", help=helptext + "; repeatable")
        else:
            p.add_argument(
                flag,
                type=_flag_type(annotation),
                choices=choices,
                metavar=None if choices else name.split("_")[-1].upper(),
                help=helptext,
            )


def _cmd(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from tinct.emulator.behaviour import Behaviour, BehaviourError, from_env
    from tinct.emulator.server import serving

    flags = {name: getattr(args, name, None) for name in Behaviour.model_fields}
    try:
        behaviour = from_env(**flags)
    except BehaviourError as e:
        print(f"tinct emulator: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("tinct.emulator")

    async def main() -> None:
        async with serving(behaviour, args.host, args.port, control=args.control) as emu:
            log.info(
                "emulating %s (no model runs) as model %r on %s%s",
                behaviour.engine,
                behaviour.model,
                emu.url,
                "; control at /emulator/config" if args.control else "",
            )
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "emulator",
        help="serve an emulated LLM engine (OpenAI API, engine metrics; no model runs)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="0.0.0.0", help="listen address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="listen port (default: %(default)s)")
    p.add_argument(
        "--control",
        action="store_true",
        help="serve GET/POST /emulator/config to read and change the behaviour at runtime (tests)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _add_fields(p)
    p.set_defaults(func=_cmd)
