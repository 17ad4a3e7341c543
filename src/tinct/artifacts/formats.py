"""Checks that an artifact is what its ``format`` says, reading as little as possible.

One reader per format, each in its own module:

- **safetensors**: :mod:`~tinct.artifacts.safetensors_header` (a shard's header, or an
  index ``*.safetensors.index.json``);
- **onnx**: :mod:`~tinct.artifacts.onnx_wire` (the protobuf wire form; the onnx checker
  too for files up to ``onnx_parse_limit``);
- **ptx**: :mod:`~tinct.artifacts.ptx`;
- **tokenizer**: :mod:`~tinct.artifacts.tokenizer`;
- **lora**: :mod:`~tinct.artifacts.lora` (a PEFT adapter's config, or its weights' header).

:func:`validate` returns the file's *facts*: what the file says about the model's interface
(ONNX inputs, outputs, opsets and metadata; safetensors tensors; PTX directives and
entries; tokenizer vocabulary and special tokens), a JSON-ready dict that
:mod:`~tinct.artifacts.interface` combines per version. Every reader streams its file and
keeps what the interface needs within the caps of :mod:`~tinct.artifacts.limits`, so the
memory one artifact costs is bounded whatever it contains.
"""

from __future__ import annotations

from collections.abc import Callable

from tinct.artifacts.lora import read_lora
from tinct.artifacts.onnx_wire import DEFAULT_ONNX_PARSE_LIMIT, read_onnx
from tinct.artifacts.ptx import read_ptx
from tinct.artifacts.reading import Facts, FormatError, Window
from tinct.artifacts.safetensors_header import is_index, read_index, read_shard
from tinct.artifacts.storage import StorageConfig, classify, resolve
from tinct.artifacts.tokenizer import tokenizer_facts

__all__ = ["DEFAULT_ONNX_PARSE_LIMIT", "READERS", "Facts", "FormatError", "validate"]

#: A reader: ``(uri, file, onnx_parse_limit) -> facts``; ValueError when the file is not valid.
Reader = Callable[[str, Window, int], Facts]

#: The reader of every artifact format (the ``format`` values of a ModelVersion's artifacts).
READERS: dict[str, Reader] = {
    "onnx": lambda _uri, win, parse_limit: read_onnx(win, parse_limit),
    "ptx": lambda _uri, win, _limit: read_ptx(win),
    "safetensors": lambda uri, win, _limit: read_index(win) if is_index(uri) else read_shard(win),
    "tokenizer": lambda uri, win, _limit: tokenizer_facts(uri, win),
    "lora": lambda uri, win, _limit: read_lora(uri, win),
}


def validate(
    uri: str,
    fmt: str,
    config: StorageConfig | None = None,
    *,
    onnx_parse_limit: int = DEFAULT_ONNX_PARSE_LIMIT,
) -> Facts:
    """Raise :class:`FormatError` unless the object at ``uri`` is a valid ``fmt`` file.

    Returns the file's interface facts (see the module docstring). A file over a cap of
    :mod:`~tinct.artifacts.limits` raises a FormatError whose ``limit`` names the cap.
    Storage failures propagate as :class:`~tinct.artifacts.storage.StorageError`.
    """
    reader = READERS.get(fmt)
    if reader is None:
        raise FormatError(uri, fmt, f"unknown format {fmt!r}")
    try:
        fs, path = resolve(uri, config)
        f = fs.open_input_file(path)
    except Exception as exc:
        raise classify(uri, exc) from exc
    try:
        return reader(uri, Window(f, int(f.size())), onnx_parse_limit)
    except ValueError as exc:  # UnicodeDecodeError and LimitExceededError are ValueErrors
        raise FormatError.of(uri, fmt, exc) from exc
    except (ArithmeticError, RecursionError) as exc:  # numbers or nesting no file should have
        raise FormatError(uri, fmt, f"{type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        raise classify(uri, exc) from exc
    finally:
        f.close()
