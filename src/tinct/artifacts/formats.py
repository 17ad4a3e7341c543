"""Checks that an artifact is what its ``format`` says, reading as little as possible.

- **safetensors**: the first 8 bytes are the little-endian header length ``N`` (at most
  100 MB, as the format specifies); the next ``N`` bytes are a JSON object whose tensors
  each have a known dtype, a shape and ``data_offsets``; the offsets must tile the data
  section exactly (no gaps, no overlap) and end at the file's size, and each tensor's
  byte length must equal ``prod(shape) * dtype size``. Only the header is read.
- **ONNX**: the file is walked as protobuf wire format at the top level of ``ModelProto``
  without reading field payloads: every tag must be well formed, every length-delimited
  field must fit in the file, the walk must end exactly at the file's end, and there must
  be a ``graph`` (field 7), at least one ``opset_import`` (field 8, each parsed) and an
  ``ir_version`` (field 1). The walk reads a few kilobytes whatever the size, so it works
  on multi-gigabyte files. Files up to ``onnx_parse_limit`` bytes are additionally parsed
  in full with the ``onnx`` package and run through ``onnx.checker.check_model``.
- **PTX**: the head of the file (64 KiB) must be text and carry the ``.version``,
  ``.target`` and ``.address_size`` directives; the rest is scanned line by line, in
  bounded chunks, for the ``.entry`` names.
- **tokenizer**: see :mod:`~tinct.artifacts.tokenizer`.
- a **safetensors index** (``*.safetensors.index.json``, declared as a ``safetensors``
  artifact) is a JSON object of at most 100 MB with a ``weight_map`` of tensor -> shard.

:func:`validate` returns the file's *facts*: what the file says about the model's interface
(ONNX inputs, outputs, opsets and metadata; safetensors tensors; PTX directives and
entries; tokenizer vocabulary and special tokens), a JSON-ready dict that
:mod:`~tinct.artifacts.interface` combines per version. Every fact is read from the same
bounded reads as the checks: the ONNX graph's inputs and outputs are walked on the wire
(initializer payloads are skipped by length), the safetensors header alone is parsed.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterator
from typing import Any, Protocol

from tinct.artifacts.storage import StorageConfig, classify, resolve

__all__ = ["DEFAULT_ONNX_PARSE_LIMIT", "FORMATS", "Facts", "FormatError", "validate"]

#: Every artifact format tinct validates.
FORMATS = ("onnx", "ptx", "safetensors", "tokenizer")

#: What one file says about the interface: JSON-ready (str keys, lists, ints, strings).
Facts = dict[str, Any]

#: Files up to this size are fully parsed by the onnx package as well as walked.
DEFAULT_ONNX_PARSE_LIMIT = 64 * 1024 * 1024

_SAFETENSORS_MAX_HEADER = 100 * 1000 * 1000
#: dtype -> size in bits (safetensors 0.5 names).
_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
_PTX_HEAD = 64 * 1024
_PTX_CHUNK = 1024 * 1024
_PTX_MAX_ENTRIES = 100_000
_WINDOW = 64 * 1024
#: Bounds of the ONNX interface walk: one input/output/metadata entry, and how many.
_ONNX_MAX_ENTRY = 1024 * 1024
_ONNX_MAX_ENTRIES = 100_000
_INDEX_MAX = 100 * 1000 * 1000


class FormatError(Exception):
    """The artifact at ``uri`` is not a valid ``fmt`` file."""

    def __init__(self, uri: str, fmt: str, detail: str) -> None:
        super().__init__(uri, fmt, detail)
        self.uri = uri
        self.fmt = fmt
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.uri} is not valid {self.fmt}: {self.detail}"


class _RandomAccess(Protocol):
    def read_at(self, nbytes: int, offset: int) -> bytes: ...


class _Window:
    """Buffered random reads over a pyarrow file: one request per 64 KiB window."""

    def __init__(self, f: _RandomAccess, size: int) -> None:
        self._f = f
        self.size = size
        self._start = 0
        self._buf = b""

    def read(self, offset: int, n: int, window: int = _WINDOW) -> bytes:
        end = offset + n
        if offset < self._start or end > self._start + len(self._buf):
            want = min(max(n, window), max(0, self.size - offset))
            self._buf = bytes(self._f.read_at(want, offset))
            self._start = offset
        lo = offset - self._start
        return self._buf[lo : lo + n]


def json_document(raw: bytes, what: str = "") -> Any:
    """``raw`` parsed as JSON; a ValueError saying ``what`` is not JSON and why otherwise
    (a document nested past the parser's recursion limit included)."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what}not JSON: {exc}") from exc
    except RecursionError:
        raise ValueError(f"{what}not JSON: nested too deeply") from None


def _check_safetensors(win: _Window) -> Facts:
    if win.size < 8:
        raise ValueError("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", win.read(0, 8))
    if n > _SAFETENSORS_MAX_HEADER:
        raise ValueError(f"header length {n} exceeds 100 MB")
    if 8 + n > win.size:
        raise ValueError(f"header length {n} runs past the end of the file ({win.size} bytes)")
    raw = win.read(8, n)
    if not raw.startswith(b"{"):
        raise ValueError("header is not a JSON object")
    header = json_document(raw, "header is ")
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    data_len = win.size - 8 - n
    spans: list[tuple[int, int, str]] = []
    tensors: dict[str, str] = {}
    metadata: dict[str, str] = {}
    for name, info in header.items():
        if name == "__metadata__":
            if isinstance(info, dict):
                metadata = {str(k): str(v) for k, v in info.items()}
            continue
        spans.append(_tensor_span(name, info))
        tensors[name] = layout(info["dtype"], info["shape"])
    spans.sort()
    cursor = 0
    for begin, end, name in spans:
        if begin != cursor:
            raise ValueError(f"tensor {name!r} starts at {begin}, expected {cursor} (gap or overlap)")
        cursor = end
    if cursor != data_len:
        raise ValueError(f"tensors cover {cursor} bytes but the data section has {data_len}")
    return {"tensors": dict(sorted(tensors.items())), "metadata": dict(sorted(metadata.items()))}


def layout(dtype: str, shape: list[int]) -> str:
    """A tensor's layout as one string, e.g. ``BF16[128256,4096]``."""
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


def _check_safetensors_index(win: _Window) -> Facts:
    if win.size > _INDEX_MAX:
        raise ValueError(f"index of {win.size} bytes exceeds 100 MB")
    index = json_document(win.read(0, win.size), "index is ")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in weight_map.items()
    ):
        raise ValueError('index has no "weight_map" object of tensor name -> shard file name')
    return {"index": dict(sorted(weight_map.items()))}


def _tensor_span(name: str, info: Any) -> tuple[int, int, str]:
    if not isinstance(info, dict):
        raise ValueError(f"tensor {name!r}: entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _DTYPE_BITS:
        raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r}: shape must be a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and o >= 0 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise ValueError(f"tensor {name!r}: data_offsets must be [begin, end] with begin <= end")
    bits = math.prod(shape) * _DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
        raise ValueError(
            f"tensor {name!r}: {dtype}{shape} needs {bits / 8:g} bytes, "
            f"offsets span {offsets[1] - offsets[0]}"
        )
    return offsets[0], offsets[1], name


def _varint(win: _Window, pos: int, window: int = _WINDOW) -> tuple[int, int]:
    value = shift = 0
    for i in range(10):
        if pos + i >= win.size:
            raise ValueError("truncated varint")
        b = win.read(pos + i, 1, window)[0]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos + i + 1
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def _fields(
    win: _Window, start: int, end: int, what: str, window: int = _WINDOW
) -> Iterator[tuple[int, int, int]]:
    """``(field, offset, length)`` of each length-delimited field in ``[start, end)``.

    Every tag is checked; varint and fixed-size fields are skipped (length -1 for them).
    """
    pos = start
    while pos < end:
        key, pos = _varint(win, pos, window)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError(f"field number 0 at offset {pos} in {what}")
        if wire == 0:
            _, pos = _varint(win, pos, window)
            yield field, pos, -1
        elif wire == 1:
            pos += 8
            yield field, pos, -1
        elif wire == 5:
            pos += 4
            yield field, pos, -1
        elif wire == 2:
            length, pos = _varint(win, pos, window)
            if pos + length > end:
                raise ValueError(f"field {field} of {length} bytes runs past the end of {what}")
            yield field, pos, length
            pos += length
        else:
            raise ValueError(f"unsupported wire type {wire} for field {field} in {what}")
        if pos > end:
            raise ValueError(f"truncated field at the end of {what}")


def _check_onnx_wire(win: _Window) -> Facts:
    """Walk ``ModelProto``; the interface facts of its graph, opsets and metadata."""
    seen: set[int] = set()
    opsets: dict[str, int] = {}
    metadata: dict[str, str] = {}
    graph: tuple[int, int] | None = None
    for field, pos, length in _fields(win, 0, win.size, "the file"):
        seen.add(field)
        if field == 8 and length >= 0:
            domain, version = _check_opset(win.read(pos, length))
            opsets[domain] = max(version, opsets.get(domain, 0))
        elif field == 14 and length >= 0:
            key, value = _string_entry(_bounded(win, pos, length, "a metadata property"))
            metadata[key] = value
            if len(metadata) > _ONNX_MAX_ENTRIES:
                raise ValueError(f"more than {_ONNX_MAX_ENTRIES} metadata properties")
        elif field == 7 and length >= 0:
            graph = (pos, length)
    if 1 not in seen:
        raise ValueError("no ir_version")
    if graph is None:
        raise ValueError("no graph")
    if not opsets:
        raise ValueError("no opset_import")
    inputs, outputs = _graph_interface(win, *graph)
    return {
        "inputs": inputs,
        "outputs": outputs,
        "opsets": dict(sorted(opsets.items())),
        "metadata": dict(sorted(metadata.items())),
    }


def _bounded(win: _Window, pos: int, length: int, what: str) -> bytes:
    if length > _ONNX_MAX_ENTRY:
        raise ValueError(f"{what} of {length} bytes exceeds {_ONNX_MAX_ENTRY // 1024} KiB")
    return win.read(pos, length, 4096)


def _graph_interface(win: _Window, start: int, length: int) -> tuple[Facts, Facts]:
    """Inputs and outputs of the ``GraphProto`` at ``start``; initializer payloads are skipped."""
    import onnx

    end = start + length
    initializers: set[str] = set()
    values: dict[int, list[Any]] = {11: [], 12: []}
    count = 0
    for field, pos, size in _fields(win, start, end, "the graph", 4096):
        if size < 0:
            continue
        if field in (5, 15):  # initializer (TensorProto), sparse_initializer (values: TensorProto)
            name = _initializer_name(win, pos, size, sparse=field == 15)
            if name:
                initializers.add(name)
        elif field in values:
            count += 1
            if count > _ONNX_MAX_ENTRIES:
                raise ValueError(f"more than {_ONNX_MAX_ENTRIES} graph inputs and outputs")
            info = onnx.ValueInfoProto()
            try:
                info.ParseFromString(_bounded(win, pos, size, "a graph input or output"))
            except Exception as exc:
                raise ValueError(f"graph input/output does not parse: {exc}") from exc
            values[field].append(info)
    inputs = {i.name: _value_facts(i) | {"optional": i.name in initializers} for i in values[11]}
    outputs = {o.name: _value_facts(o) for o in values[12]}
    return dict(sorted(inputs.items())), dict(sorted(outputs.items()))


def _initializer_name(win: _Window, start: int, length: int, *, sparse: bool) -> str:
    """The ``name`` (field 8) of a TensorProto without reading its data."""
    for field, pos, size in _fields(win, start, start + length, "an initializer", 4096):
        if sparse and field == 1 and size >= 0:
            return _initializer_name(win, pos, size, sparse=False)
        if not sparse and field == 8 and size >= 0:
            return _bounded(win, pos, size, "an initializer name").decode("utf-8", errors="replace")
    return ""


def _value_facts(info: Any) -> Facts:
    import onnx

    kind = info.type.WhichOneof("value")
    if kind != "tensor_type":
        return {"dtype": kind or "unknown", "shape": None}
    tt = info.type.tensor_type
    dtype = (
        onnx.TensorProto.DataType.Name(tt.elem_type)
        if tt.elem_type in onnx.TensorProto.DataType.values()
        else str(tt.elem_type)
    )
    if not tt.HasField("shape"):
        return {"dtype": dtype, "shape": None}
    shape: list[int | str | None] = []
    for d in tt.shape.dim:
        which = d.WhichOneof("value")
        shape.append(d.dim_value if which == "dim_value" else d.dim_param if which == "dim_param" else None)
    return {"dtype": dtype, "shape": shape}


def _string_entry(raw: bytes) -> tuple[str, str]:
    import onnx

    entry = onnx.StringStringEntryProto()
    try:
        entry.ParseFromString(raw)
    except Exception as exc:
        raise ValueError(f"metadata property does not parse: {exc}") from exc
    return entry.key, entry.value


def _check_opset(raw: bytes) -> tuple[str, int]:
    import onnx

    opset = onnx.OperatorSetIdProto()
    try:
        opset.ParseFromString(raw)
    except Exception as exc:
        raise ValueError(f"opset_import does not parse: {exc}") from exc
    if opset.version <= 0:
        raise ValueError(f"opset_import {opset.domain or 'ai.onnx'!r} has version {opset.version}")
    return opset.domain or "ai.onnx", int(opset.version)


def _check_onnx_full(raw: bytes) -> None:
    import onnx

    try:
        model = onnx.load_model_from_string(raw)
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ValueError(f"onnx rejects the model: {exc}") from exc


_PTX_DIRECTIVES = {
    ".version": re.compile(r"^\s*\.version\s+(\d+\.\d+)\b", re.MULTILINE),
    ".target": re.compile(r"^\s*\.target\s+([\w ,]+)", re.MULTILINE),
    ".address_size": re.compile(r"^\s*\.address_size\s+(32|64)\b", re.MULTILINE),
}
_PTX_ENTRY = re.compile(
    rb"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+)?\.entry[ \t]+([A-Za-z_$%][\w$]*)", re.MULTILINE
)


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL))


def _check_ptx(head: bytes) -> Facts:
    if b"\x00" in head:
        raise ValueError("binary content (NUL bytes); PTX is text")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = head[: head.rfind(b"\n") + 1].decode("utf-8", errors="strict")
    text = _strip_comments(text)
    found = {d: rx.search(text) for d, rx in _PTX_DIRECTIVES.items()}
    missing = [d for d, m in found.items() if m is None]
    if missing:
        raise ValueError(f"missing directive(s) {', '.join(missing)} in the first {_PTX_HEAD // 1024} KiB")
    targets = [t.strip() for t in found[".target"].group(1).split(",") if t.strip()]  # type: ignore[union-attr]
    sm = next((t for t in targets if re.fullmatch(r"sm_\d+[a-z]?", t)), targets[0])
    return {
        "version": found[".version"].group(1),  # type: ignore[union-attr]
        "target": sm,
        "target_options": sorted(t for t in targets if t != sm),
        "address_size": int(found[".address_size"].group(1)),  # type: ignore[union-attr]
    }


def _ptx_entries(win: _Window) -> list[str]:
    """Names of the ``.entry`` kernels, scanning the file in 1 MiB chunks split at newlines."""
    entries: set[str] = set()
    pos = 0
    carry = b""
    while pos < win.size:
        n = min(_PTX_CHUNK, win.size - pos)
        chunk = carry + win.read(pos, n, _PTX_CHUNK)
        pos += n
        if b"\x00" in chunk:
            raise ValueError("binary content (NUL bytes); PTX is text")
        cut = chunk.rfind(b"\n") + 1 if pos < win.size else len(chunk)
        if cut == 0 and len(chunk) > 4 * _PTX_CHUNK:
            raise ValueError("a line longer than 4 MiB; PTX is text")
        body, carry = chunk[:cut], chunk[cut:]
        body = re.sub(rb"//[^\n]*", b"", body)
        for m in _PTX_ENTRY.finditer(body):
            entries.add(m.group(1).decode("ascii", errors="replace"))
        if len(entries) > _PTX_MAX_ENTRIES:
            raise ValueError(f"more than {_PTX_MAX_ENTRIES} .entry kernels")
    return sorted(entries)


def validate(
    uri: str,
    fmt: str,
    config: StorageConfig | None = None,
    *,
    onnx_parse_limit: int = DEFAULT_ONNX_PARSE_LIMIT,
) -> Facts:
    """Raise :class:`FormatError` unless the object at ``uri`` is a valid ``fmt`` file.

    Returns the file's interface facts (see the module docstring). Storage failures
    propagate as :class:`~tinct.artifacts.storage.StorageError`.
    """
    from tinct.artifacts.tokenizer import tokenizer_facts

    try:
        fs, path = resolve(uri, config)
        f = fs.open_input_file(path)
    except Exception as exc:
        raise classify(uri, exc) from exc
    try:
        size = int(f.size())
        win = _Window(f, size)
        if fmt == "safetensors":
            if _is_index(uri):
                return _check_safetensors_index(win)
            return _check_safetensors(win)
        if fmt == "onnx":
            facts = _check_onnx_wire(win)
            if size <= onnx_parse_limit:
                _check_onnx_full(win.read(0, size))
            return facts
        if fmt == "ptx":
            facts = _check_ptx(win.read(0, min(size, _PTX_HEAD)))
            facts["entries"] = _ptx_entries(win)
            return facts
        if fmt == "tokenizer":
            return tokenizer_facts(uri, win.size, lambda: win.read(0, win.size, 0))
        raise ValueError(f"unknown format {fmt!r}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(uri, fmt, str(exc)) from exc
    except OSError as exc:
        raise classify(uri, exc) from exc
    finally:
        f.close()


def _is_index(uri: str) -> bool:
    return uri.rstrip("/").lower().endswith(".json")
