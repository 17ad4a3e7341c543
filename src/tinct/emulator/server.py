"""The emulator's HTTP server: OpenAI-compatible endpoints, ``/metrics``, and its control.

Endpoints (aiohttp, :func:`make_app`):

- ``POST /v1/chat/completions``, ``POST /v1/completions``: a JSON object as OpenAI takes it.
  With ``"stream": true`` the answer is Server-Sent Events: the head and (chat) a first event
  with the assistant role go out at once, the content events follow when the request has a
  slot and its time to first token passed, one token each, ``itl_ms`` apart, then one with
  ``finish_reason``, one with ``usage`` when ``stream_options.include_usage`` asks, and
  ``data: [DONE]``. Without, one ``chat.completion`` / ``text_completion`` object once the
  whole answer is generated. ``max_tokens`` (or ``max_completion_tokens``) caps the tokens.
  What the answer says -- text, JSON for ``response_format``, tool calls for ``tools``, and
  the drift and noise that tell two engines apart -- comes from :mod:`tinct.emulator.answers`.
- ``GET /v1/models``: the model, ``owned_by`` saying it is emulated, and the LoRA adapters
  loaded at run time with ``parent`` the model (:mod:`tinct.emulator.lora`, which also serves
  the engines' load and unload endpoints with ``runtime_lora``).
- ``GET /healthz``: ``ok``. ``GET /metrics``: the engine's metrics (:mod:`tinct.emulator.metrics`).
- ``GET``/``POST /emulator/config`` (only when started with ``control``): the behaviour as
  JSON, or a JSON object of fields to change (:func:`~tinct.emulator.behaviour.updated`;
  at most :data:`MAX_CONTROL_BODY` bytes). A change applies to requests that arrive after it.

Every answer carries ``X-Tinct-Emulator``: no model runs here, the tokens are placeholders.
A request whose ``X-Scheduler-Version`` is not in ``accept_versions`` gets a 426 whose
``Upgrade`` names the versions served (``tinct-scheduler/v1``), as RFC 9110 asks of a 426.
Request bodies are bounded (:data:`MAX_BODY`); what cannot be parsed gets an OpenAI error.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tinct.emulator import lora
from tinct.emulator.answers import Content, Sampler, compose
from tinct.emulator.behaviour import Behaviour, BehaviourError, updated
from tinct.emulator.engine import EngineState, Slot
from tinct.emulator.metrics import exposition

__all__ = ["EMULATOR_HEADER", "MAX_BODY", "MAX_CONTROL_BODY", "Emulator", "make_app", "serving"]

#: The header on every answer saying that an engine is emulated.
EMULATOR_HEADER = "X-Tinct-Emulator"
MAX_BODY = 4 * 1024 * 1024
MAX_CONTROL_BODY = 64 * 1024
CHARS_PER_TOKEN = 4

STATE: web.AppKey[EngineState] = web.AppKey("state", EngineState)
_ADMISSION: web.AppKey[_Admission] = web.AppKey("admission")
_SAMPLER: web.AppKey[Sampler] = web.AppKey("sampler", Sampler)


def _notice(b: Behaviour) -> str:
    return f"{b.engine} emulated by tinct; no model runs"


def _error(
    status: int, message: str, kind: str, code: str, b: Behaviour, extra: dict[str, str] | None = None
) -> web.Response:
    headers = {EMULATOR_HEADER: _notice(b), **(extra or {})}
    if b.contract == "error-body" and (status == 429 or status >= 500):
        return web.Response(status=status, text=f"{status} {message}\n", headers=headers)
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


class _Admission:
    """Which requests get 5xx or 429: exactly the configured shares, deterministically (each
    request adds the rate; a whole unit picks it), so a test sees the share it set."""

    def __init__(self) -> None:
        self.error = 0.0
        self.throttle = 0.0

    def pick(self, b: Behaviour) -> str | None:
        self.error += b.error_rate
        if self.error >= 1.0:
            self.error -= 1.0
            return "error"
        self.throttle += b.throttle_rate
        if self.throttle >= 1.0:
            self.throttle -= 1.0
            return "throttle"
        return None


def _prompt_tokens(path: str, doc: dict[str, Any]) -> int:
    chars = 0
    if path.endswith("/chat/completions"):
        for m in doc.get("messages") or []:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                chars += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    else:
        prompt = doc.get("prompt")
        if isinstance(prompt, str):
            chars = len(prompt)
        elif isinstance(prompt, list):
            chars = sum(len(p) if isinstance(p, str) else CHARS_PER_TOKEN for p in prompt)
    return max(1, chars // CHARS_PER_TOKEN)


def _wanted_tokens(doc: dict[str, Any], b: Behaviour) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        v = doc.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return min(v, b.output_tokens)
    return b.output_tokens


@dataclass
class _Answer:
    """One answer being generated: its ids and what it has said so far."""

    chat: bool
    b: Behaviour
    created: int
    rid: str
    #: The model that answers: the base, or a LoRA adapter the request named.
    model: str

    def base(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        doc = self.base()
        if self.b.contract == "no-choices":
            if choice is not None:
                doc.update({k: v for k, v in choice.items() if k != "index"})
            return doc
        doc["choices"] = [] if choice is None else [choice]
        return doc

    def delta(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            d: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                d["content"] = text
            return self.chunk({"index": 0, "delta": d, "logprobs": None, "finish_reason": finish})
        return self.chunk({"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish})

    def call(self, index: int, call: dict[str, Any]) -> dict[str, Any]:
        """A stream chunk with one whole tool call at ``index``."""
        d = {"tool_calls": [{"index": index, **call}]}
        return self.chunk({"index": 0, "delta": d, "logprobs": None, "finish_reason": None})

    def whole(self, content: Content, usage: dict[str, int]) -> dict[str, Any]:
        doc = self.base()
        doc["object"] = "chat.completion" if self.chat else "text_completion"
        finish = content.finish_reason
        if self.b.contract != "no-choices":
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": content.text}
                if content.tool_calls:
                    message.update(content=None, tool_calls=content.tool_calls)
                doc["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}]
            else:
                doc["choices"] = [
                    {"index": 0, "text": content.text, "logprobs": None, "finish_reason": finish}
                ]
        doc["usage"] = usage
        return doc


def _event(doc: dict[str, Any] | str, b: Behaviour) -> bytes:
    text = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
    if b.contract == "sse-unframed":
        return f"{text}\n\n".encode()
    return f"data: {text}\n\n".encode()


async def _generate(st: EngineState, slot: Slot, n: int, arrived: float, b: Behaviour) -> AsyncIterator[int]:
    """The ``n`` tokens of one answer, each when its time comes; counted in ``st`` as they go."""
    await asyncio.sleep(b.ttft_ms / 1000)
    last = time.monotonic()
    st.observe("ttft", last - arrived)
    for i in range(n):
        if i:
            await asyncio.sleep(b.itl_ms / 1000)
            now = time.monotonic()
            st.observe("itl", now - last)
            last = now
        slot.token()
        yield i


async def _completion(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    st.received += 1
    b = st.behaviour
    arrived = time.monotonic()
    try:
        doc = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _error(400, "the request body is not valid JSON", "invalid_request_error", "invalid_json", b)
    if not isinstance(doc, dict):
        return _error(
            400, "the request body must be a JSON object", "invalid_request_error", "invalid_json", b
        )
    if b.head_delay_ms:
        await asyncio.sleep(b.head_delay_ms / 1000)
    version = request.headers.get("X-Scheduler-Version")
    if b.accept_versions and version not in b.accept_versions:
        msg = f"scheduler version {version!r} is not served here (serving {', '.join(b.accept_versions)})"
        # RFC 9110 §15.5.22: a 426 names the protocols to upgrade to: the versions served.
        upgrade = ", ".join(f"tinct-scheduler/{v}" for v in b.accept_versions)
        return _error(
            426,
            msg,
            "invalid_request_error",
            "version_mismatch",
            b,
            {"Upgrade": upgrade, "Connection": "Upgrade"},
        )
    refused = lora.unknown_model(st, doc.get("model"))
    if refused is not None:
        status, message = refused
        return _error(
            status, message, "NotFoundError" if status == 404 else "BadRequestError", "model_not_found", b
        )
    adapter = doc.get("model") if doc.get("model") in st.adapters else None
    fate = request.app[_ADMISSION].pick(b)
    if fate == "throttle":
        return _error(429, "rate limit reached, retry later", "rate_limit_error", "rate_limit_exceeded", b)
    if fate == "error":
        return _error(b.error_status, "the engine failed (emulated)", "server_error", "engine_error", b)
    chat = request.path == "/v1/chat/completions"
    rid = f"{'chatcmpl' if chat else 'cmpl'}-emu{st.requests}"
    answer = _Answer(chat, b, int(time.time()), rid, adapter or b.model)
    content = compose(doc, _wanted_tokens(doc, b), b, request.app[_SAMPLER], answer.rid, chat, answer.model)
    n = len(content.tool_calls) or len(content.tokens)
    prompt = _prompt_tokens(request.path, doc)
    if doc.get("stream") is True:
        opts = doc.get("stream_options")
        usage = isinstance(opts, dict) and opts.get("include_usage") is True
        return await _stream(request, st, answer, content, prompt, arrived, usage, adapter)
    async with st.slot(prompt, adapter) as slot:
        async for _ in _generate(st, slot, n, arrived, b):
            pass
    _finished(st, n, arrived)
    counts = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    return web.json_response(answer.whole(content, counts), headers={EMULATOR_HEADER: _notice(b)})


def _finished(st: EngineState, n: int, arrived: float) -> None:
    st.observe("e2e", time.monotonic() - arrived)
    st.observe("output_tokens", n)
    st.finish("stop")


async def _stream(
    request: web.Request,
    st: EngineState,
    answer: _Answer,
    content: Content,
    prompt: int,
    arrived: float,
    usage: bool,
    adapter: str | None,
) -> web.StreamResponse:
    b = answer.b
    n = len(content.tool_calls) or len(content.tokens)
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            EMULATOR_HEADER: _notice(b),
        }
    )
    await resp.prepare(request)
    if answer.chat:  # the role comes at once: bytes flow before the first token
        await resp.write(_event(answer.delta(None, None, role=True), b))
    async with st.slot(prompt, adapter) as slot:
        async for i in _generate(st, slot, n, arrived, b):
            if b.cut_after_tokens is not None and i >= b.cut_after_tokens:
                st.finish("abort")
                assert request.transport is not None
                request.transport.close()  # a dying engine: the stream ends without its end
                return resp
            if content.tool_calls:
                await resp.write(_event(answer.call(i, content.tool_calls[i]), b))
            else:
                await resp.write(_event(answer.delta(content.tokens[i], None), b))
    _finished(st, n, arrived)
    await resp.write(_event(answer.delta(None if answer.chat else "", content.finish_reason), b))
    if usage:
        doc = answer.base()
        if b.contract != "no-choices":
            doc["choices"] = []
        doc["usage"] = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        await resp.write(_event(doc, b))
    if b.contract not in ("sse-unframed", "sse-no-done"):
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _models(request: web.Request) -> web.Response:
    st = request.app[STATE]
    b = st.behaviour
    data = lora.model_entries(st, f"tinct-emulator ({_notice(b)})")
    return web.json_response({"object": "list", "data": data}, headers={EMULATOR_HEADER: _notice(b)})


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n", headers={EMULATOR_HEADER: _notice(request.app[STATE].behaviour)})


async def _metrics(request: web.Request) -> web.Response:
    body = exposition(request.app[STATE])
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def _get_config(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].behaviour.public())


async def _set_config(request: web.Request) -> web.Response:
    st = request.app[STATE]
    if (request.content_length or 0) > MAX_CONTROL_BODY:
        return web.json_response({"error": f"over {MAX_CONTROL_BODY} bytes"}, status=413)
    raw = await request.content.read(MAX_CONTROL_BODY + 1)
    if len(raw) > MAX_CONTROL_BODY:
        return web.json_response({"error": f"over {MAX_CONTROL_BODY} bytes"}, status=413)
    try:
        changes = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return web.json_response({"error": "the body is not JSON"}, status=400)
    if not isinstance(changes, dict):
        return web.json_response({"error": "send a JSON object of the fields to change"}, status=400)
    try:
        st.behaviour = updated(st.behaviour, changes)
    except BehaviourError as e:
        return web.json_response({"error": str(e)}, status=422)
    st.resized()
    return web.json_response(st.behaviour.public())


def make_app(behaviour: Behaviour, *, control: bool = False) -> web.Application:
    """The emulator's application; ``control`` adds ``/emulator/config``."""
    app = web.Application(client_max_size=MAX_BODY)
    app[STATE] = EngineState(behaviour)
    app[_ADMISSION] = _Admission()
    app[_SAMPLER] = Sampler()
    app.router.add_post("/v1/chat/completions", _completion)
    app.router.add_post("/v1/completions", _completion)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    lora.add_routes(app, app[STATE])
    if control:
        app.router.add_get("/emulator/config", _get_config)
        app.router.add_post("/emulator/config", _set_config)
    return app


@dataclass
class Emulator:
    """A running emulator: its base URL and its state (to read or change from the same loop)."""

    url: str
    port: int
    state: EngineState

    def set(self, **changes: Any) -> Behaviour:
        """Change the behaviour in process (what ``POST /emulator/config`` does)."""
        self.state.behaviour = updated(self.state.behaviour, changes)
        self.state.resized()
        return self.state.behaviour

    def restart(self) -> None:
        """Forget what a restarted engine process forgets: the adapters loaded at run time."""
        self.state.adapters.clear()


@asynccontextmanager
async def serving(
    behaviour: Behaviour | None = None, host: str = "127.0.0.1", port: int = 0, *, control: bool = False
) -> AsyncIterator[Emulator]:
    """Serve an emulator on ``host:port`` (0: a free port) for the duration of the block."""
    app = make_app(behaviour or Behaviour(), control=control)
    # A client that leaves cancels its request, as engines abort requests whose client is gone.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    shown = f"[{host}]" if ":" in host else host
    try:
        yield Emulator(f"http://{shown}:{bound}", bound, app[STATE])
    finally:
        await runner.cleanup()
