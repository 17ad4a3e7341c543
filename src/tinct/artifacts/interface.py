"""A ModelVersion's interface: the facts of its artifacts, combined per format, and a digest.

:func:`~tinct.artifacts.formats.validate` returns the facts of one file; :func:`combine`
turns the facts of every artifact of a version into its **interface**, a JSON-ready dict:

- ``onnx`` and ``ptx``: one entry per file, keyed by file name (``model.onnx``), holding
  that file's facts (inputs/outputs/opsets/metadata; version/target/address size/entries);
- ``safetensors``: the shards merged into one: ``tensors`` (name -> ``DTYPE[shape]``),
  ``metadata``, and what the tensors imply: ``vocab_size`` and ``hidden_size`` from the
  token embedding, ``layers`` from the highest layer index in the names. With an index
  (``*.safetensors.index.json``) every tensor must be in the shard the index names;
- ``tokenizer``: ``tokenizer.json`` and ``tokenizer_config.json`` merged: ``vocab_size``,
  ``vocab_digest``, ``special_tokens``, ``chat_template_digest``;
- ``lora``: a PEFT adapter's config and weights joined (:func:`~tinct.artifacts.lora.combine_lora`):
  ``peft_type``, ``r``, ``lora_alpha``, ``target_modules``, ``base_model``, and per adapted
  module its rank and the shape of the base weight it fits.

:func:`digest` is the SHA-256 of the interface's canonical JSON: equal interfaces have
equal digests whatever the URIs, so it names the contract a version offers.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import sys
from collections.abc import Iterable
from typing import Any

from tinct.artifacts.limits import SAFETENSORS_MAX_TENSORS, LimitExceededError
from tinct.artifacts.lora import AdapterInconsistentError, combine_lora
from tinct.errors import AboutError
from tinct.text import listing, quote

__all__ = ["Interface", "InterfaceError", "combine", "digest", "summary"]

#: format -> facts (see the module docstring).
Interface = dict[str, Any]

#: Names of the token embedding, by the model families that use them.
_EMBEDDINGS = (
    "embed_tokens.weight",
    "tok_embeddings.weight",
    "word_embeddings.weight",
    "wte.weight",
    "embed_in.weight",
    "embed.weight",
    "embedding.weight",
)
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer|block)\.(\d+)\.")
_LAYOUT = re.compile(r"^(\w+)\[([0-9,]*)\]$")


class InterfaceError(AboutError, ValueError):
    """The artifacts of one format (``fmt``) contradict each other (e.g. a shard and its index)."""

    def __init__(self, fmt: str, detail: str) -> None:
        super().__init__(f"{fmt} artifacts disagree", detail)
        self.fmt = fmt


def _name(uri: str) -> str:
    return posixpath.basename(uri.rstrip("/")) or uri


def _shape(layout: str) -> list[int]:
    m = _LAYOUT.match(layout)
    if m is None or not m.group(2):
        return []
    return [int(d) for d in m.group(2).split(",")]


def _safetensors(files: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    tensors: dict[str, str] = {}
    where: dict[str, str] = {}
    metadata: dict[str, str] = {}
    index: dict[str, str] | None = None
    for uri, facts in files:
        if "index" in facts:
            if index is not None:
                raise InterfaceError("safetensors", "more than one index file is declared")
            index = facts["index"]
            continue
        metadata.update(facts.get("metadata") or {})
        shard = sys.intern(_name(uri))
        for name, layout in (facts.get("tensors") or {}).items():
            if name in tensors and tensors[name] != layout:
                raise InterfaceError(
                    "safetensors",
                    f"tensor {quote(name)} is {tensors[name]} in {quote(where[name])} "
                    f"but {layout} in {quote(shard)}",
                )
            tensors[name] = layout
            where[name] = shard
            if len(tensors) > SAFETENSORS_MAX_TENSORS:
                raise LimitExceededError(
                    "the safetensors shards hold more tensors together",
                    "SAFETENSORS_MAX_TENSORS",
                    SAFETENSORS_MAX_TENSORS,
                    "tensors",
                )
    if index is not None:
        _check_index(index, where)
    names = sorted(tensors)
    vocab = hidden = None
    for suffix in _EMBEDDINGS:
        emb = next((n for n in names if n == suffix or n.endswith("." + suffix)), None)
        if emb is not None and len(_shape(tensors[emb])) == 2:
            vocab, hidden = _shape(tensors[emb])
            break
    layers = max((int(m.group(1)) for n in names if (m := _LAYER.search(n))), default=None)
    return {
        "tensors": {n: tensors[n] for n in names},
        "metadata": dict(sorted(metadata.items())),
        "vocab_size": vocab,
        "hidden_size": hidden,
        "layers": layers + 1 if layers is not None else None,
        "indexed": index is not None,
    }


def _check_index(index: dict[str, str], where: dict[str, str]) -> None:
    """Every tensor is in the shard ``index`` names, and every shard it names is declared."""
    missing = sorted(set(index.values()) - set(where.values()))
    if missing:
        raise InterfaceError(
            "safetensors",
            f"the index names {len(missing):,} shard(s) that no artifact declares: {listing(missing)}",
        )
    for name, shard in index.items():
        if where.get(name) != shard:
            found = f"in {quote(where[name])}" if name in where else "in no shard"
            raise InterfaceError(
                "safetensors", f"the index puts tensor {quote(name)} in {quote(shard)}, it is {found}"
            )
    extra = sorted(set(where) - set(index))
    if extra:
        raise InterfaceError(
            "safetensors",
            f"{len(extra):,} tensor(s) are in the shards but not in the index: {listing(extra, 5)}",
        )


def _tokenizer(files: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "vocab_size": None,
        "vocab_digest": None,
        "special_tokens": {},
        "chat_template_digest": None,
    }
    kinds = [facts.get("file") for _, facts in files]
    for kind in set(kinds):
        if kinds.count(kind) > 1:
            raise InterfaceError("tokenizer", f"more than one {kind} is declared")
    for _, facts in files:
        out["special_tokens"].update(facts.get("special_tokens") or {})
        for key in ("vocab_size", "vocab_digest", "chat_template_digest"):
            if facts.get(key) is not None:
                out[key] = facts[key]
    out["special_tokens"] = dict(sorted(out["special_tokens"].items()))
    return out


def combine(files: Iterable[tuple[str, str, dict[str, Any]]]) -> Interface:
    """The interface of a version from ``(format, uri, facts)`` of each artifact.

    Raises:
        InterfaceError: files of one format contradict each other.
        LimitExceededError: the safetensors shards hold more than SAFETENSORS_MAX_TENSORS.
    """
    grouped: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for fmt, uri, facts in files:
        grouped.setdefault(fmt, []).append((uri, facts))
    out: Interface = {}
    for fmt, items in sorted(grouped.items()):
        if fmt == "safetensors":
            out[fmt] = _safetensors(items)
        elif fmt == "tokenizer":
            out[fmt] = _tokenizer(items)
        elif fmt == "lora":
            try:
                out[fmt] = combine_lora(items)
            except AdapterInconsistentError as exc:
                raise InterfaceError("lora", str(exc)) from None
        else:
            per_file: dict[str, Any] = {}
            for uri, facts in items:
                name = _name(uri)
                if name in per_file:
                    raise InterfaceError(fmt, f"two artifacts are named {name}")
                per_file[name] = facts
            out[fmt] = dict(sorted(per_file.items()))
    return out


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(interface: Interface) -> str:
    """The interface as canonical JSON (sorted keys, no spaces)."""
    return _CANONICAL.encode(interface)


def digest(interface: Interface) -> str:
    """SHA-256 of :func:`canonical`, hashed as it is encoded (never the whole text at once:
    the interface of half a million tensors is tens of megabytes of it)."""
    sha = hashlib.sha256()
    pending: list[str] = []
    size = 0
    for chunk in _CANONICAL.iterencode(interface):
        pending.append(chunk)
        size += len(chunk)
        if size > 1 << 20:
            sha.update("".join(pending).encode("utf-8", "surrogatepass"))
            pending.clear()
            size = 0
    sha.update("".join(pending).encode("utf-8", "surrogatepass"))
    return sha.hexdigest()


def summary(interface: Interface) -> str:
    """One line a person reads in ``kubectl get -o yaml``, e.g. for ``status.interface``."""
    parts: list[str] = []
    for name, facts in (interface.get("onnx") or {}).items():
        opsets = ",".join(f"{d} {v}" for d, v in facts["opsets"].items())
        parts.append(
            f"onnx {name}: inputs {','.join(facts['inputs']) or '-'}; "
            f"outputs {','.join(facts['outputs']) or '-'}; opset {opsets}"
        )
    st = interface.get("safetensors")
    if st is not None:
        parts.append(
            f"safetensors: {len(st['tensors'])} tensors, vocab {st['vocab_size']}, "
            f"hidden {st['hidden_size']}, layers {st['layers']}"
        )
    for name, facts in (interface.get("ptx") or {}).items():
        parts.append(
            f"ptx {name}: {facts['version']} {facts['target']} {facts['address_size']}-bit, "
            f"{len(facts['entries'])} entries"
        )
    lora = interface.get("lora")
    if lora is not None:
        targets = lora["target_modules"]
        shown = ",".join(targets) if isinstance(targets, list) else targets
        parts.append(
            f"lora: r {lora['r']}, alpha {lora['lora_alpha']}, {len(lora['modules'])} modules "
            f"({shown}), base {lora['base_model']}"
        )
    tok = interface.get("tokenizer")
    if tok is not None:
        chat = "chat template" if tok["chat_template_digest"] else "no chat template"
        parts.append(
            f"tokenizer: vocab {tok['vocab_size']}, {len(tok['special_tokens'])} special tokens, {chat}"
        )
    text = " | ".join(parts)
    return text if len(text) <= 1024 else text[:1021] + "..."
