"""The ``onnx`` format, read on the protobuf wire without its weights.

The file is walked as protobuf wire format at the top level of ``ModelProto`` without
reading field payloads: every tag must be well formed, every length-delimited field must
fit in the file, the walk must end exactly at the file's end, and there must be a
``graph`` (field 7), at least one ``opset_import`` (field 8, each parsed) and an
``ir_version`` (field 1). Inside the graph only the inputs (field 11) and outputs (12) are
parsed, one entry at a time, and the *name* of each initializer (fields 5 and 15), to tell
which inputs an initializer backs (optional ones); initializer payloads and nodes are
skipped by their length. What is kept is the interface: inputs, outputs, opsets and
``metadata_props``, each entry at most :data:`~tinct.artifacts.limits.ONNX_MAX_ENTRY`
bytes, at most :data:`~tinct.artifacts.limits.ONNX_MAX_ENTRIES` of them and
:data:`~tinct.artifacts.limits.ONNX_MAX_INTERFACE` bytes together, so a graph with a
million inputs or a 2 GB initializer table costs no more memory than a small one.

Files up to ``parse_limit`` bytes are additionally parsed in full with the ``onnx`` package
and run through ``onnx.checker.check_model``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tinct.artifacts.limits import (
    ONNX_MAX_ENTRIES,
    ONNX_MAX_ENTRY,
    ONNX_MAX_INTERFACE,
    LimitExceededError,
)
from tinct.artifacts.reading import WINDOW, Facts, Window

__all__ = ["DEFAULT_ONNX_PARSE_LIMIT", "read_onnx"]

#: Files up to this size are fully parsed by the onnx package as well as walked.
DEFAULT_ONNX_PARSE_LIMIT = 64 * 1024 * 1024

#: Window of the reads inside the graph, where fields are small or skipped.
_SMALL = 4096
_INPUT, _OUTPUT, _INITIALIZER, _SPARSE_INITIALIZER = 11, 12, 5, 15


def _varint(win: Window, pos: int, window: int = WINDOW) -> tuple[int, int]:
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
    win: Window, start: int, end: int, what: str, window: int = WINDOW
) -> Iterator[tuple[int, int, int]]:
    """``(field, offset, length)`` of each field in ``[start, end)``.

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


class _Interface:
    """The entries of the interface read so far, within the caps."""

    def __init__(self, win: Window) -> None:
        self._win = win
        self.entries = 0
        self.bytes = 0

    def read(self, pos: int, length: int, what: str) -> bytes:
        if length > ONNX_MAX_ENTRY:
            raise LimitExceededError(f"{what} of {length:,} bytes", "ONNX_MAX_ENTRY", ONNX_MAX_ENTRY, "bytes")
        self.entries += 1
        self.bytes += length
        if self.entries > ONNX_MAX_ENTRIES:
            raise LimitExceededError(
                "more graph inputs, outputs, metadata properties and opset imports",
                "ONNX_MAX_ENTRIES",
                ONNX_MAX_ENTRIES,
                "entries",
            )
        if self.bytes > ONNX_MAX_INTERFACE:
            raise LimitExceededError(
                "graph inputs, outputs, metadata properties and opset imports together",
                "ONNX_MAX_INTERFACE",
                ONNX_MAX_INTERFACE,
                "bytes",
            )
        return self._win.read(pos, length, _SMALL)


def _parse(message: Any, raw: bytes, what: str) -> Any:
    """``message`` (an empty onnx protobuf message) filled from ``raw``."""
    try:
        message.ParseFromString(raw)
    except Exception as exc:
        raise ValueError(f"{what} does not parse: {exc}") from exc
    return message


def read_onnx(win: Window, parse_limit: int = DEFAULT_ONNX_PARSE_LIMIT) -> Facts:
    """Walk ``ModelProto``; the interface facts of its graph, opsets and metadata."""
    import onnx

    seen: set[int] = set()
    opsets: dict[str, int] = {}
    metadata: dict[str, str] = {}
    graph: tuple[int, int] | None = None
    kept = _Interface(win)
    for field, pos, length in _fields(win, 0, win.size, "the file"):
        seen.add(field)
        if field == 8 and length >= 0:
            opset = _parse(
                onnx.OperatorSetIdProto(), kept.read(pos, length, "an opset_import"), "opset_import"
            )
            domain = opset.domain or "ai.onnx"
            if opset.version <= 0:
                raise ValueError(f"opset_import {domain!r} has version {opset.version}")
            opsets[domain] = max(int(opset.version), opsets.get(domain, 0))
        elif field == 14 and length >= 0:
            raw = kept.read(pos, length, "a metadata property")
            entry = _parse(onnx.StringStringEntryProto(), raw, "metadata property")
            metadata[entry.key] = entry.value
        elif field == 7 and length >= 0:
            graph = (pos, length)
    if 1 not in seen:
        raise ValueError("no ir_version")
    if graph is None:
        raise ValueError("no graph")
    if not opsets:
        raise ValueError("no opset_import")
    inputs, outputs = _graph_interface(win, *graph, kept)
    if win.size <= parse_limit:
        _check_full(win.read(0, win.size))
    return {
        "inputs": inputs,
        "outputs": outputs,
        "opsets": dict(sorted(opsets.items())),
        "metadata": dict(sorted(metadata.items())),
    }


def _graph_interface(win: Window, start: int, length: int, kept: _Interface) -> tuple[Facts, Facts]:
    """Inputs and outputs of the ``GraphProto`` at ``start``; initializer payloads are skipped.

    Two walks: the inputs and outputs first, then the initializers' names, of which only
    those naming an input matter (so none is kept).
    """
    import onnx

    end = start + length
    found: dict[int, Facts] = {_INPUT: {}, _OUTPUT: {}}
    for field, pos, size in _fields(win, start, end, "the graph", _SMALL):
        if size >= 0 and field in found:
            raw = kept.read(pos, size, "a graph input or output")
            info = _parse(onnx.ValueInfoProto(), raw, "graph input/output")
            found[field][info.name] = _value_facts(info)
    inputs, outputs = found[_INPUT], found[_OUTPUT]
    backed: set[str] = set()
    if inputs:
        for field, pos, size in _fields(win, start, end, "the graph", _SMALL):
            if size >= 0 and field in (_INITIALIZER, _SPARSE_INITIALIZER):
                name = _initializer_name(win, pos, size, sparse=field == _SPARSE_INITIALIZER)
                if name in inputs:
                    backed.add(name)
    for name, facts in inputs.items():
        facts["optional"] = name in backed
    return dict(sorted(inputs.items())), dict(sorted(outputs.items()))


def _initializer_name(win: Window, start: int, length: int, *, sparse: bool) -> str:
    """The ``name`` (field 8) of a TensorProto (the ``values`` of a sparse one) without its data."""
    for field, pos, size in _fields(win, start, start + length, "an initializer", _SMALL):
        if sparse and field == 1 and size >= 0:
            return _initializer_name(win, pos, size, sparse=False)
        if not sparse and field == 8 and size >= 0:
            if size > ONNX_MAX_ENTRY:
                raise LimitExceededError(
                    f"an initializer name of {size:,} bytes", "ONNX_MAX_ENTRY", ONNX_MAX_ENTRY, "bytes"
                )
            return win.read(pos, size, _SMALL).decode("utf-8", errors="replace")
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


def _check_full(raw: bytes) -> None:
    """The onnx checker on the serialized model: parsed once, in C++, not into Python too."""
    import onnx.checker

    try:
        onnx.checker.check_model(raw)
    except Exception as exc:
        raise ValueError(f"onnx rejects the model: {exc}") from exc
