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
  ``.target`` and ``.address_size`` directives.
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import Any, Protocol

from tinct.artifacts.storage import StorageConfig, classify, resolve

__all__ = ["DEFAULT_ONNX_PARSE_LIMIT", "FormatError", "validate"]

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
_WINDOW = 64 * 1024


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

    def read(self, offset: int, n: int) -> bytes:
        end = offset + n
        if offset < self._start or end > self._start + len(self._buf):
            want = min(max(n, _WINDOW), max(0, self.size - offset))
            self._buf = bytes(self._f.read_at(want, offset))
            self._start = offset
        lo = offset - self._start
        return self._buf[lo : lo + n]


def _check_safetensors(win: _Window) -> None:
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
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    data_len = win.size - 8 - n
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        spans.append(_tensor_span(name, info))
    spans.sort()
    cursor = 0
    for begin, end, name in spans:
        if begin != cursor:
            raise ValueError(f"tensor {name!r} starts at {begin}, expected {cursor} (gap or overlap)")
        cursor = end
    if cursor != data_len:
        raise ValueError(f"tensors cover {cursor} bytes but the data section has {data_len}")


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


def _varint(win: _Window, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(10):
        if pos + i >= win.size:
            raise ValueError("truncated varint")
        b = win.read(pos + i, 1)[0]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos + i + 1
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def _check_onnx_wire(win: _Window) -> None:
    seen: set[int] = set()
    pos = 0
    opsets = 0
    while pos < win.size:
        key, pos = _varint(win, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError(f"field number 0 at offset {pos}")
        seen.add(field)
        if wire == 0:
            _, pos = _varint(win, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(win, pos)
            if pos + length > win.size:
                raise ValueError(f"field {field} of {length} bytes runs past the end of the file")
            if field == 8:
                _check_opset(win.read(pos, length))
                opsets += 1
            pos += length
        else:
            raise ValueError(f"unsupported wire type {wire} for field {field}")
        if pos > win.size:
            raise ValueError("truncated field at the end of the file")
    if 1 not in seen:
        raise ValueError("no ir_version")
    if 7 not in seen:
        raise ValueError("no graph")
    if not opsets:
        raise ValueError("no opset_import")


def _check_opset(raw: bytes) -> None:
    import onnx

    opset = onnx.OperatorSetIdProto()
    try:
        opset.ParseFromString(raw)
    except Exception as exc:
        raise ValueError(f"opset_import does not parse: {exc}") from exc
    if opset.version <= 0:
        raise ValueError(f"opset_import {opset.domain or 'ai.onnx'!r} has version {opset.version}")


def _check_onnx_full(raw: bytes) -> None:
    import onnx

    try:
        model = onnx.load_model_from_string(raw)
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ValueError(f"onnx rejects the model: {exc}") from exc


_PTX_DIRECTIVES = {
    ".version": re.compile(r"^\s*\.version\s+\d+\.\d+\b", re.MULTILINE),
    ".target": re.compile(r"^\s*\.target\s+\w+", re.MULTILINE),
    ".address_size": re.compile(r"^\s*\.address_size\s+(32|64)\b", re.MULTILINE),
}


def _check_ptx(head: bytes) -> None:
    if b"\x00" in head:
        raise ValueError("binary content (NUL bytes); PTX is text")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = head[: head.rfind(b"\n") + 1].decode("utf-8", errors="strict")
    text = re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL))
    missing = [d for d, rx in _PTX_DIRECTIVES.items() if not rx.search(text)]
    if missing:
        raise ValueError(f"missing directive(s) {', '.join(missing)} in the first {_PTX_HEAD // 1024} KiB")


def validate(
    uri: str,
    fmt: str,
    config: StorageConfig | None = None,
    *,
    onnx_parse_limit: int = DEFAULT_ONNX_PARSE_LIMIT,
) -> None:
    """Raise :class:`FormatError` unless the object at ``uri`` is a valid ``fmt`` file.

    Storage failures propagate as :class:`~tinct.artifacts.storage.StorageError`.
    """
    try:
        fs, path = resolve(uri, config)
        f = fs.open_input_file(path)
    except Exception as exc:
        raise classify(uri, exc) from exc
    try:
        size = int(f.size())
        win = _Window(f, size)
        if fmt == "safetensors":
            _check_safetensors(win)
        elif fmt == "onnx":
            _check_onnx_wire(win)
            if size <= onnx_parse_limit:
                _check_onnx_full(win.read(0, size))
        elif fmt == "ptx":
            _check_ptx(win.read(0, min(size, _PTX_HEAD)))
        else:
            raise ValueError(f"unknown format {fmt!r}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(uri, fmt, str(exc)) from exc
    except OSError as exc:
        raise classify(uri, exc) from exc
    finally:
        f.close()
