"""LoRA adapters loaded into the emulated engine at run time, as vLLM and SGLang do it.

With ``runtime_lora`` the engine serves the endpoints each engine has for it, with its
request and answer shapes:

- **vLLM** (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=true``):
  ``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter`` with a JSON object
  ``{"lora_name": ..., "lora_path": ...}`` (unload: ``lora_name``); success is a 200 whose
  text says so, a refusal an OpenAI error object with status 400 (already loaded, rank over
  ``--max-lora-rank``, not an adapter directory) or 404 (no such directory; unloading an
  adapter that is not loaded).
- **SGLang** (``--enable-lora``): ``POST /load_lora_adapter`` and ``POST /unload_lora_adapter``
  with the same fields; the answer is ``{"success": bool, "error_message": str,
  "loaded_adapters": {name: path}}``, 200 on success and 400 otherwise.

Without ``runtime_lora`` (or on the other engine's paths, or TGI) the endpoints answer 404, as
an engine does that was not started for them. ``lora_path`` is a directory on the engine's
file system (a ``file://`` URI is taken as its path) holding ``adapter_config.json`` and
``adapter_model.safetensors``, a PEFT adapter as saved; its ``r`` is held to
``max_lora_rank``, and a load beyond ``max_loras`` adapters is refused as out of memory.

A loaded adapter is a model of its own: ``/v1/models`` lists it with ``parent`` the base
model and ``root`` its path, a completion naming it is answered by it ("Emulated answer from
NAME.", so answers tell adapters apart), and any other name that is not the base model gets
404 (vLLM's "The model `x` does not exist.") or 400 (SGLang). vLLM's
``vllm:lora_requests_info`` gauge names the adapters with requests running and waiting.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from tinct.emulator.behaviour import Behaviour
from tinct.emulator.engine import Adapter, EngineState

__all__ = [
    "CONFIG_FILE",
    "LOAD_PATHS",
    "MAX_CONFIG_BYTES",
    "UNLOAD_PATHS",
    "WEIGHTS_FILE",
    "add_routes",
    "lora_info",
    "model_entries",
    "unknown_model",
]

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: The most of an ``adapter_config.json`` the engine reads.
MAX_CONFIG_BYTES = 1 << 20
#: engine -> the path of its load endpoint, and of its unload endpoint.
LOAD_PATHS = {"vllm": "/v1/load_lora_adapter", "sglang": "/load_lora_adapter"}
UNLOAD_PATHS = {"vllm": "/v1/unload_lora_adapter", "sglang": "/unload_lora_adapter"}
_NOTICE_HEADER = "X-Tinct-Emulator"


class LoadRefusedError(Exception):
    """A load or unload the engine refuses: the status it answers and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _notice(b: Behaviour) -> dict[str, str]:
    return {_NOTICE_HEADER: f"{b.engine} emulated by tinct; no model runs"}


def _refusal(b: Behaviour, state: EngineState, e: LoadRefusedError) -> web.Response:
    if b.engine == "sglang":
        body: dict[str, Any] = {
            "success": False,
            "error_message": e.message,
            "loaded_adapters": {a.name: a.path for a in state.adapters.values()},
        }
        return web.json_response(body, status=400, headers=_notice(b))
    kind = "NotFoundError" if e.status == 404 else "BadRequestError"
    error = {"message": e.message, "type": kind, "param": None, "code": e.status}
    return web.json_response({"error": error}, status=e.status, headers=_notice(b))


def _done(b: Behaviour, state: EngineState, text: str) -> web.Response:
    if b.engine == "sglang":
        body = {
            "success": True,
            "error_message": "",
            "loaded_adapters": {a.name: a.path for a in state.adapters.values()},
        }
        return web.json_response(body, headers=_notice(b))
    return web.Response(text=text, headers=_notice(b))


async def _fields(request: web.Request, *names: str) -> dict[str, str]:
    try:
        doc = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise LoadRefusedError(400, "the request body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise LoadRefusedError(400, "the request body must be a JSON object")
    out: dict[str, str] = {}
    for name in names:
        value = doc.get(name)
        if not isinstance(value, str) or not value:
            raise LoadRefusedError(
                400, f"both 'lora_name' and 'lora_path' must be provided ({name!r} is missing)"
            )
        out[name] = value
    return out


def _read_config(path: str) -> dict[str, Any]:
    """The ``adapter_config.json`` of the adapter directory ``path`` (blocking)."""
    where = Path(path.removeprefix("file://"))
    config, weights = where / CONFIG_FILE, where / WEIGHTS_FILE
    if not where.is_dir():
        raise LoadRefusedError(404, f"no adapter found at {path}: not a directory")
    if not config.is_file() or not weights.is_file():
        raise LoadRefusedError(
            400, f"{path} is not a LoRA adapter: it needs {CONFIG_FILE} and {WEIGHTS_FILE}"
        )
    with config.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise LoadRefusedError(400, f"{CONFIG_FILE} at {path} is too large")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise LoadRefusedError(400, f"{CONFIG_FILE} at {path} is not valid JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("r"), int) or isinstance(doc.get("r"), bool):
        raise LoadRefusedError(400, f"{CONFIG_FILE} at {path} has no integer rank 'r'")
    return doc


def _allowed(request: web.Request, state: EngineState, paths: dict[str, str]) -> Behaviour:
    """The behaviour, when this engine serves ``request``'s path; else the 404 an engine gives."""
    b = state.behaviour
    if not b.runtime_lora or paths.get(b.engine) != request.path:
        raise web.HTTPNotFound(text='{"detail":"Not Found"}', content_type="application/json")
    return b


async def _load(request: web.Request, state: EngineState) -> web.Response:
    b = _allowed(request, state, LOAD_PATHS)
    try:
        got = await _fields(request, "lora_name", "lora_path")
        name, path = got["lora_name"], got["lora_path"]
        if name in state.adapters:
            raise LoadRefusedError(400, f"The lora adapter '{name}' has already been loaded.")
        if b.lora_load_ms:
            await asyncio.sleep(b.lora_load_ms / 1000)
        config = await asyncio.get_running_loop().run_in_executor(None, _read_config, path)
        rank = int(config["r"])
        b = state.behaviour  # it may have changed meanwhile
        if rank > b.max_lora_rank:
            raise LoadRefusedError(400, f"LoRA rank {rank} is greater than max_lora_rank {b.max_lora_rank}.")
        if len(state.adapters) >= b.max_loras:
            raise LoadRefusedError(
                500,
                f"out of memory: cannot hold another LoRA adapter ({len(state.adapters)} loaded, "
                f"max_loras {b.max_loras})",
            )
        if name in state.adapters:  # loaded by another request while this one read the files
            raise LoadRefusedError(400, f"The lora adapter '{name}' has already been loaded.")
    except LoadRefusedError as e:
        return _refusal(b, state, e)
    base = config.get("base_model_name_or_path")
    state.adapters[name] = Adapter(
        name, path, rank, base if isinstance(base, str) else None, int(time.time())
    )
    return _done(b, state, f"Success: LoRA adapter '{name}' added successfully.")


async def _unload(request: web.Request, state: EngineState) -> web.Response:
    b = _allowed(request, state, UNLOAD_PATHS)
    try:
        name = (await _fields(request, "lora_name"))["lora_name"]
        if state.adapters.pop(name, None) is None:
            raise LoadRefusedError(404, f"The lora adapter '{name}' cannot be found.")
    except LoadRefusedError as e:
        return _refusal(b, state, e)
    return _done(b, state, f"Success: LoRA adapter '{name}' removed successfully.")


def add_routes(app: web.Application, state: EngineState) -> None:
    """Serve both engines' load and unload paths on ``app`` (each answers only its engine's)."""

    async def load(request: web.Request) -> web.Response:
        return await _load(request, state)

    async def unload(request: web.Request) -> web.Response:
        return await _unload(request, state)

    for path in LOAD_PATHS.values():
        app.router.add_post(path, load)
    for path in UNLOAD_PATHS.values():
        app.router.add_post(path, unload)


def model_entries(state: EngineState, owned_by: str) -> list[dict[str, Any]]:
    """``/v1/models`` entries: the base model, then each adapter with ``parent`` the base."""
    b = state.behaviour
    base = {
        "id": b.model,
        "object": "model",
        "created": 0,
        "owned_by": owned_by,
        "root": b.model,
        "parent": None,
    }
    adapters = [
        {
            "id": a.name,
            "object": "model",
            "created": a.loaded_at,
            "owned_by": owned_by,
            "root": a.path,
            "parent": b.model,
        }
        for a in state.adapters.values()
    ]
    return [base, *adapters]


def unknown_model(state: EngineState, model: object) -> tuple[int, str] | None:
    """(status, message) of the refusal of a completion naming ``model``, when an engine
    serving adapters refuses it (not the base, no adapter of that name); None: it is served."""
    b = state.behaviour
    if not b.runtime_lora or model is None or model == b.model or model in state.adapters:
        return None
    if b.engine == "sglang":
        return 400, f"The LoRA adapter {model!r} is not loaded (base model {b.model!r})."
    return 404, f"The model `{model}` does not exist."


def lora_info(state: EngineState) -> tuple[dict[str, str], float]:
    """Labels and value of vLLM's ``vllm:lora_requests_info`` gauge (the value is a time)."""
    return (
        {
            "max_lora": str(state.behaviour.max_loras),
            "running_lora_adapters": ",".join(sorted(state.adapter_running)),
            "waiting_lora_adapters": ",".join(sorted(state.adapter_waiting)),
        },
        time.time(),
    )
