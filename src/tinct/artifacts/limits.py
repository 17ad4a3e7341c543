"""The caps on what the operator reads from one artifact, and the error that names one.

Every reader streams its file and keeps only what the interface needs, so the memory one
artifact costs depends on these caps, not on the file (``bench/artifacts.py`` measures the
worst case at the caps: ``artifact_rss_growth_mb``). A file over a cap fails its version with
``Verified=False``, reason ``LimitExceeded``, and a message naming the cap; nothing is
retried until the spec changes. docs/operations/limits.md lists them for users.
"""

from __future__ import annotations

__all__ = [
    "CHAT_TEMPLATE_MAX_CHARS",
    "INDEX_MAX_BYTES",
    "INDEX_MAX_ENTRIES",
    "JSON_MAX_DEPTH",
    "JSON_MAX_TOKEN",
    "LORA_CONFIG_MAX_BYTES",
    "ONNX_MAX_ENTRIES",
    "ONNX_MAX_ENTRY",
    "ONNX_MAX_INTERFACE",
    "PTX_MAX_ENTRIES",
    "PTX_MAX_ENTRY_BYTES",
    "PTX_MAX_LINE",
    "SAFETENSORS_MAX_HEADER",
    "SAFETENSORS_MAX_METADATA",
    "SAFETENSORS_MAX_RANK",
    "SAFETENSORS_MAX_TENSORS",
    "SPECIAL_TOKEN_MAX_CHARS",
    "TOKENIZER_MAX_BYTES",
    "TOKENIZER_MAX_SPECIAL",
    "TOKENIZER_MAX_VOCAB",
    "LimitExceededError",
]

KiB = 1024
MiB = 1024 * KiB

#: safetensors: bytes of one file's JSON header (the format itself allows 100 MB).
SAFETENSORS_MAX_HEADER = 64 * MiB
#: safetensors: tensors in one file, and in all the shards of a version together.
SAFETENSORS_MAX_TENSORS = 524_288
#: safetensors: characters of one file's ``__metadata__`` (keys and values).
SAFETENSORS_MAX_METADATA = 1 * MiB
#: safetensors: dimensions of one tensor's shape.
SAFETENSORS_MAX_RANK = 64
#: safetensors index (``*.safetensors.index.json``): bytes of the file.
INDEX_MAX_BYTES = 64 * MiB
#: safetensors index: tensor -> shard entries of its ``weight_map``.
INDEX_MAX_ENTRIES = SAFETENSORS_MAX_TENSORS

#: tokenizer: bytes of ``tokenizer.json`` or ``tokenizer_config.json``.
TOKENIZER_MAX_BYTES = 64 * MiB
#: tokenizer: entries of the vocabulary and the added tokens together.
TOKENIZER_MAX_VOCAB = 2_097_152
#: tokenizer: special tokens (added tokens marked special, or named in the config).
TOKENIZER_MAX_SPECIAL = 65_536
#: tokenizer: characters of one special token.
SPECIAL_TOKEN_MAX_CHARS = 256
#: tokenizer: characters of the chat template (all named templates together).
CHAT_TEMPLATE_MAX_CHARS = 4 * MiB

#: lora: bytes of an ``adapter_config.json``.
LORA_CONFIG_MAX_BYTES = 1 * MiB

#: Any JSON artifact: bytes of one string or number (a run without a string boundary).
JSON_MAX_TOKEN = 4 * MiB
#: Any JSON artifact: nesting of arrays and objects.
JSON_MAX_DEPTH = 64

#: ONNX: bytes of one graph input or output, metadata property or opset import.
ONNX_MAX_ENTRY = 1 * MiB
#: ONNX: graph inputs, outputs, metadata properties and opset imports together.
ONNX_MAX_ENTRIES = 100_000
#: ONNX: bytes of those entries together.
ONNX_MAX_INTERFACE = 16 * MiB

#: PTX: ``.entry`` kernels.
PTX_MAX_ENTRIES = 100_000
#: PTX: bytes of the ``.entry`` names together.
PTX_MAX_ENTRY_BYTES = 16 * MiB
#: PTX: bytes of one line.
PTX_MAX_LINE = 4 * MiB


def _amount(value: int, unit: str) -> str:
    if unit == "bytes" and value >= MiB and value % MiB == 0:
        return f"{value // MiB} MiB"
    if unit == "bytes" and value >= KiB and value % KiB == 0:
        return f"{value // KiB} KiB"
    return f"{value:,} {unit}"


class LimitExceededError(ValueError):
    """``what`` is over the cap ``cap`` (a name of this module) of ``limit`` ``unit``."""

    def __init__(self, what: str, cap: str, limit: int, unit: str) -> None:
        super().__init__(what, cap, limit, unit)
        self.what = what
        self.cap = cap
        self.limit = limit
        self.unit = unit

    def __str__(self) -> str:
        return f"{self.what}: over the limit of {_amount(self.limit, self.unit)} ({self.cap})"
