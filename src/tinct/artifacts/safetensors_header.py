"""The ``safetensors`` format: a shard's header, or the index of a sharded checkpoint.

- **shard**: the first 8 bytes are the little-endian header length ``N`` (at most
  :data:`~tinct.artifacts.limits.SAFETENSORS_MAX_HEADER`); the next ``N`` bytes are a JSON
  object whose tensors each have a known dtype, a shape and ``data_offsets``; the offsets
  must tile the data section exactly (no gaps, no overlap) and end at the file's size, and
  each tensor's byte length must equal ``prod(shape) * dtype size``. Only the header is
  read, as a stream; what is kept is one ``name -> DTYPE[shape]`` entry and two offsets per
  tensor (at most :data:`~tinct.artifacts.limits.SAFETENSORS_MAX_TENSORS`).
- **index** (``*.safetensors.index.json``, declared as a ``safetensors`` artifact): a JSON
  object with a ``weight_map`` of tensor -> shard file name, at most
  :data:`~tinct.artifacts.limits.INDEX_MAX_BYTES` and
  :data:`~tinct.artifacts.limits.INDEX_MAX_ENTRIES` entries; nothing else of it is kept.
"""

from __future__ import annotations

import math
import struct
from array import array
from typing import Any

import numpy as np

from tinct.artifacts.jsonstream import JsonStream
from tinct.artifacts.limits import (
    INDEX_MAX_BYTES,
    INDEX_MAX_ENTRIES,
    SAFETENSORS_MAX_HEADER,
    SAFETENSORS_MAX_METADATA,
    SAFETENSORS_MAX_RANK,
    SAFETENSORS_MAX_TENSORS,
    LimitExceededError,
)
from tinct.artifacts.reading import Facts, Window
from tinct.text import quote

__all__ = ["is_index", "layout", "read_index", "read_shard"]

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
#: Characters (and values) one tensor's entry may have: its dtype, offsets and a shape of
#: up to SAFETENSORS_MAX_RANK dimensions, with room to spare.
_ENTRY_UNITS = 64 * (SAFETENSORS_MAX_RANK + 16)
#: Characters of one shard file name.
_SHARD_NAME_UNITS = 4096


def is_index(uri: str) -> bool:
    """Whether a ``safetensors`` artifact at ``uri`` is an index (a ``.json`` file)."""
    return uri.rstrip("/").lower().endswith(".json")


def layout(dtype: str, shape: list[int]) -> str:
    """A tensor's layout as one string, e.g. ``BF16[128256,4096]``."""
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


def _tensor(name: str, info: Any, data_len: int) -> tuple[int, int, str]:
    """``(begin, end, layout)`` of one header entry, checked."""
    if not isinstance(info, dict):
        raise ValueError(f"tensor {quote(name)}: entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _DTYPE_BITS:
        raise ValueError(f"tensor {quote(name)}: unknown dtype {quote(str(dtype), 40)}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError(f"tensor {quote(name)}: shape must be a list of non-negative integers")
    if len(shape) > SAFETENSORS_MAX_RANK:
        raise LimitExceededError(
            f"tensor {quote(name)} has {len(shape)} dimensions",
            "SAFETENSORS_MAX_RANK",
            SAFETENSORS_MAX_RANK,
            "dimensions",
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise ValueError(f"tensor {quote(name)}: data_offsets must be [begin, end] with begin <= end")
    if offsets[1] > data_len:
        raise ValueError(
            f"tensor {quote(name)}: data_offsets end at {offsets[1]}, past the data section ({data_len} bytes)"
        )
    bits = math.prod(shape) * _DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
        raise ValueError(
            f"tensor {quote(name)}: {dtype}{shape} needs {bits / 8:g} bytes, "
            f"offsets span {offsets[1] - offsets[0]}"
        )
    return offsets[0], offsets[1], layout(dtype, shape)


def _check_tiling(begins: array[int], ends: array[int], names: list[str], data_len: int) -> None:
    """The spans, in order of (begin, end), must cover ``[0, data_len)`` with no gap or overlap."""
    if not names:
        if data_len:
            raise ValueError(f"tensors cover 0 bytes but the data section has {data_len}")
        return
    b = np.frombuffer(begins, dtype=np.int64)
    e = np.frombuffer(ends, dtype=np.int64)
    order = np.lexsort((e, b))
    sb, se = b[order], e[order]
    expected = np.concatenate((np.zeros(1, dtype=np.int64), se[:-1]))
    bad = np.flatnonzero(sb != expected)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"tensor {quote(names[int(order[i])])} starts at {int(sb[i])}, "
            f"expected {int(expected[i])} (gap or overlap)"
        )
    if int(se[-1]) != data_len:
        raise ValueError(f"tensors cover {int(se[-1])} bytes but the data section has {data_len}")


def read_shard(win: Window) -> Facts:
    """The facts of a safetensors file: ``tensors`` (name -> layout) and ``metadata``."""
    if win.size < 8:
        raise ValueError("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", win.read(0, 8))
    if n > SAFETENSORS_MAX_HEADER:
        raise LimitExceededError(
            f"header of {n:,} bytes", "SAFETENSORS_MAX_HEADER", SAFETENSORS_MAX_HEADER, "bytes"
        )
    if 8 + n > win.size:
        raise ValueError(f"header length {n} runs past the end of the file ({win.size} bytes)")
    if win.read(8, 1) != b"{":
        raise ValueError("header is not a JSON object")
    data_len = win.size - 8 - n
    doc = JsonStream(win.stream(8, n), "header is ")
    tensors: dict[str, str] = {}
    layouts: dict[str, str] = {}  # one string per layout, however many tensors have it
    begins, ends = array("q"), array("q")
    metadata: dict[str, str] = {}
    for name in doc.object_keys():
        if name == "__metadata__":
            info = doc.value(SAFETENSORS_MAX_METADATA, "__metadata__", "SAFETENSORS_MAX_METADATA")
            if isinstance(info, dict):
                metadata = {str(k): str(v) for k, v in info.items()}
            continue
        if name in tensors:
            raise ValueError(f"tensor {quote(name)} is listed twice")
        if len(tensors) >= SAFETENSORS_MAX_TENSORS:
            raise LimitExceededError(
                "the header lists more tensors", "SAFETENSORS_MAX_TENSORS", SAFETENSORS_MAX_TENSORS, "tensors"
            )
        begin, end, tensor_layout = _tensor(
            name, doc.value(_ENTRY_UNITS, f"tensor {quote(name)}: entry"), data_len
        )
        tensors[name] = layouts.setdefault(tensor_layout, tensor_layout)
        begins.append(begin)
        ends.append(end)
    doc.end()
    _check_tiling(begins, ends, list(tensors), data_len)
    return {"tensors": _sorted(tensors), "metadata": _sorted(metadata)}


def _sorted(d: dict[str, str]) -> dict[str, str]:
    """``d`` in key order, built without a list of its items (a tuple each) on the way."""
    return {k: d[k] for k in sorted(d)}


def read_index(win: Window) -> Facts:
    """The facts of an index: ``index`` (tensor -> shard file name)."""
    if win.size > INDEX_MAX_BYTES:
        raise LimitExceededError(f"index of {win.size:,} bytes", "INDEX_MAX_BYTES", INDEX_MAX_BYTES, "bytes")
    doc = JsonStream(win.stream(0, win.size), "index is ")
    weight_map: dict[str, str] | None = None
    shards: dict[str, str] = {}  # one string per shard name, however many tensors name it
    for key in doc.object_keys():
        if key != "weight_map" or doc.kind() != "object":
            doc.skip()
            continue
        if weight_map is not None:
            raise ValueError('index has "weight_map" twice')
        weight_map = {}
        for name in doc.object_keys():
            shard = doc.value(_SHARD_NAME_UNITS, f"shard of tensor {quote(name)}")
            if not isinstance(shard, str) or not shard:
                raise ValueError(
                    f"index maps tensor {quote(name)} to {quote(str(shard), 60)}, not a file name"
                )
            if name in weight_map:
                raise ValueError(f"index lists tensor {quote(name)} twice")
            if len(weight_map) >= INDEX_MAX_ENTRIES:
                raise LimitExceededError(
                    "index lists more tensors", "INDEX_MAX_ENTRIES", INDEX_MAX_ENTRIES, "entries"
                )
            weight_map[name] = shards.setdefault(shard, shard)
    doc.end()
    if weight_map is None:
        raise ValueError('index has no "weight_map" object of tensor name -> shard file name')
    return {"index": _sorted(weight_map)}
