"""The ``lora`` format: a PEFT LoRA adapter, and whether it fits the base it was trained on.

An adapter as PEFT saves it is a directory of two files, each declared as a ``lora``
artifact of the ModelVersion:

- ``adapter_config.json`` (at most :data:`~tinct.artifacts.limits.LORA_CONFIG_MAX_BYTES`):
  ``peft_type`` (``LORA``: what vLLM and SGLang serve), the rank ``r``, ``lora_alpha``,
  ``target_modules`` (module names, or one regular expression), ``base_model_name_or_path``,
  and ``rank_pattern`` (ranks of some modules other than ``r``);
- ``adapter_model.safetensors``, read as any safetensors file (its header only): per adapted
  module ``<module>.lora_A.weight`` ``[r, in]`` and ``<module>.lora_B.weight`` ``[out, r]``
  (an embedding: ``lora_embedding_A`` ``[r, num_embeddings]`` and ``lora_embedding_B``
  ``[embedding_dim, r]``), the module named as in the base model, prefixed ``base_model.model.``.

:func:`read_lora` returns either file's facts, :func:`combine_lora` the version's ``lora``
interface: the config's facts and, per module, its rank and the shape of the base weight it
fits (``[out, in]``; an embedding's ``[num_embeddings, embedding_dim]``). An adapter at odds
with itself is refused there (a ``lora_A`` without its ``lora_B``, a rank other than the
config's, a target module without weights, the two files apart or misnamed: engines load the
directory by those names). :func:`check_against_base` holds the interface to the base
version's recorded safetensors tensors before anything is served.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tinct.artifacts.jsonstream import JsonStream
from tinct.artifacts.limits import LORA_CONFIG_MAX_BYTES, LimitExceededError
from tinct.artifacts.reading import Facts, Window
from tinct.artifacts.safetensors_header import read_shard
from tinct.text import listing, quote

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "AdapterInconsistentError",
    "BaseMismatch",
    "adapter_directory",
    "check_against_base",
    "combine_lora",
    "read_lora",
    "served_name",
]

#: Hex digits of the adapter's digest in the name engines serve it under.
DIGEST_PREFIX = 12
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEPT: dict[str, type | tuple[type, ...]] = {
    "peft_type": str,
    "r": int,
    "lora_alpha": (int, float),
    "target_modules": (list, str),
    "base_model_name_or_path": str,
    "rank_pattern": dict,
    "task_type": str,
    "use_dora": bool,
}
_LORA_TENSOR = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>.+?)\."
    r"(?:(?P<part>lora_A|lora_B)(?:\.weight)?|(?P<emb>lora_embedding_A|lora_embedding_B))$"
)
_LAYOUT = re.compile(r"^\w+\[([0-9,]*)\]$")


def _shape(layout: str) -> list[int]:
    m = _LAYOUT.match(layout)
    return [int(d) for d in m.group(1).split(",")] if m and m.group(1) else []


def _config(win: Window) -> Facts:
    if win.size > LORA_CONFIG_MAX_BYTES:
        raise LimitExceededError(
            f"{win.size:,} bytes", "LORA_CONFIG_MAX_BYTES", LORA_CONFIG_MAX_BYTES, "bytes"
        )
    doc = JsonStream(win.stream(0, win.size), f"{CONFIG_FILE} is ")
    got: dict[str, Any] = {}
    for key in doc.object_keys():
        if key not in _KEPT:
            doc.skip()
            continue
        value = doc.value(LORA_CONFIG_MAX_BYTES, f"{CONFIG_FILE} {key}")
        if value is None:
            continue
        if not isinstance(value, _KEPT[key]) or (isinstance(value, bool) and key != "use_dora"):
            raise ValueError(f"{CONFIG_FILE}: {key} is {quote(str(value), 60)}, not what PEFT writes")
        got[key] = value
    doc.end()
    peft = got.get("peft_type")
    if peft != "LORA":
        raise ValueError(
            f"{CONFIG_FILE}: peft_type is {quote(str(peft), 40)}; vLLM and SGLang serve LORA adapters"
        )
    r = got.get("r")
    if not isinstance(r, int) or r < 1:
        raise ValueError(f"{CONFIG_FILE}: r (the rank) must be a positive integer")
    targets = got.get("target_modules", [])
    if isinstance(targets, list):
        if not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"{CONFIG_FILE}: target_modules must be module names")
        targets = sorted(set(targets))
    pattern = got.get("rank_pattern") or {}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pattern.values()):
        raise ValueError(f"{CONFIG_FILE}: rank_pattern must map module names to positive ranks")
    return {
        "file": CONFIG_FILE,
        "peft_type": peft,
        "r": r,
        "lora_alpha": got.get("lora_alpha"),
        "target_modules": targets,
        "base_model": got.get("base_model_name_or_path"),
        "rank_pattern": dict(sorted(pattern.items())),
        "task_type": got.get("task_type"),
        "use_dora": bool(got.get("use_dora", False)),
    }


def read_lora(uri: str, win: Window) -> Facts:
    """The facts of one file of an adapter: its config (a ``.json`` file) or its weights.

    Raises:
        ValueError: not a PEFT LoRA config, or not a valid safetensors file.
        LimitExceededError: over a cap.
    """
    if uri.rstrip("/").lower().endswith(".json"):
        return _config(win)
    facts = read_shard(win)
    return {"file": WEIGHTS_FILE, "tensors": facts["tensors"], "metadata": facts["metadata"]}


def served_name(model: str, lora_digest: str) -> str:
    """The model name engines serve an adapter of ``model`` whose files digest to
    ``lora_digest`` under: distinct per content, so a re-upload under the same name never meets
    an engine's cache of the old one, and an answer names the lineage row it comes from."""
    return f"{model[:240]}-{lora_digest[:DIGEST_PREFIX]}"


def _name(uri: str) -> str:
    return posixpath.basename(uri.rstrip("/"))


def adapter_directory(uris: Sequence[str]) -> str:
    """The directory an adapter's files are in (what an engine is told to load)."""
    return posixpath.dirname(uris[0].rstrip("/"))


def _rank_for(module: str, r: int, pattern: Mapping[str, int]) -> int:
    for key, rank in pattern.items():
        if module == key or module.endswith("." + key) or re.fullmatch(key, module):
            return rank
    return r


class AdapterInconsistentError(ValueError):
    """The ``lora`` files of a version are not one adapter; the message says why."""


def combine_lora(files: Sequence[tuple[str, Facts]]) -> dict[str, Any]:
    """The ``lora`` interface of a version from ``(uri, facts)`` of its ``lora`` artifacts.

    Raises:
        AdapterInconsistentError: the files are not one adapter (the caller makes it an
            :class:`~tinct.artifacts.interface.InterfaceError`).
    """
    configs = [(u, f) for u, f in files if f.get("file") == CONFIG_FILE]
    weights = [(u, f) for u, f in files if f.get("file") == WEIGHTS_FILE]
    if len(configs) != 1 or len(weights) != 1:
        raise AdapterInconsistentError(
            f"an adapter is one {CONFIG_FILE} and one {WEIGHTS_FILE}; "
            f"{len(configs)} config(s) and {len(weights)} weight file(s) are declared"
        )
    (curi, config), (wuri, tensors_facts) = configs[0], weights[0]
    names = {_name(curi): CONFIG_FILE, _name(wuri): WEIGHTS_FILE}
    if set(names) != {CONFIG_FILE, WEIGHTS_FILE}:
        raise AdapterInconsistentError(
            f"the files must be named {CONFIG_FILE} and {WEIGHTS_FILE}, as engines load them "
            f"(got {quote(_name(curi))} and {quote(_name(wuri))})"
        )
    if adapter_directory([curi]) != adapter_directory([wuri]):
        raise AdapterInconsistentError(
            f"{CONFIG_FILE} and {WEIGHTS_FILE} must be in one directory: engines load the directory"
        )
    parts: dict[str, dict[str, list[int]]] = {}
    embeddings: set[str] = set()
    extra: list[str] = []
    for name, layout in (tensors_facts.get("tensors") or {}).items():
        m = _LORA_TENSOR.match(name)
        if m is None:
            extra.append(name)
            continue
        module = m.group("module")
        part = m.group("part") or m.group("emb")
        if m.group("emb"):
            embeddings.add(module)
        shape = _shape(layout)
        if len(shape) != 2:
            raise AdapterInconsistentError(
                f"tensor {quote(name)} is {layout}: a LoRA matrix has two dimensions"
            )
        parts.setdefault(module, {})[part[-1]] = shape
    r, pattern = int(config["r"]), config.get("rank_pattern") or {}
    modules: dict[str, dict[str, Any]] = {}
    for module in sorted(parts):
        got = parts[module]
        if set(got) != {"A", "B"}:
            lone = "A" if "A" in got else "B"
            raise AdapterInconsistentError(f"module {quote(module)} has lora_{lone} but not its other half")
        a, b = got["A"], got["B"]
        if a[0] != b[1]:
            raise AdapterInconsistentError(
                f"module {quote(module)}: lora_A is {a} and lora_B is {b}: their ranks ({a[0]}, {b[1]}) differ"
            )
        want = _rank_for(module, r, pattern)
        if a[0] != want:
            raise AdapterInconsistentError(
                f"module {quote(module)} has rank {a[0]} but {CONFIG_FILE} says r={want}"
            )
        embedding = module in embeddings
        modules[module] = {
            "rank": a[0],
            "lora_A": a,
            "lora_B": b,
            # The base weight it adapts: [out, in], or an embedding's [num_embeddings, dim].
            "base_shape": [a[1], b[0]] if embedding else [b[0], a[1]],
        }
    if not modules:
        raise AdapterInconsistentError(f"{WEIGHTS_FILE} holds no lora_A/lora_B tensors")
    targets = config.get("target_modules")
    if isinstance(targets, list):
        bare = {mod.rsplit(".", 1)[-1] for mod in modules}
        missing = [t for t in targets if t not in bare and not any(mod.endswith("." + t) for mod in modules)]
        if missing:
            raise AdapterInconsistentError(
                f"target module(s) {listing(missing)} of {CONFIG_FILE} have no lora weights"
            )
    return {
        "peft_type": config["peft_type"],
        "r": r,
        "lora_alpha": config.get("lora_alpha"),
        "target_modules": targets,
        "base_model": config.get("base_model"),
        "max_rank": max(m["rank"] for m in modules.values()),
        "modules": modules,
        "extra_tensors": sorted(extra),
    }


@dataclass(frozen=True)
class BaseMismatch:
    """Why an adapter does not fit its base: a ``BaseCompatible`` reason and its message."""

    reason: str
    message: str


def _names_base(config_base: str | None, model: str) -> bool:
    if not config_base:
        return False
    said = config_base.rstrip("/").lower()
    return said == model.lower() or said.rsplit("/", 1)[-1] == model.lower()


def check_against_base(
    adapter: Mapping[str, Any],
    base: Mapping[str, Any],
    *,
    base_name: str,
    base_model: str,
    max_rank: int | None,
    quantized: bool = False,
) -> BaseMismatch | None:
    """Whether the ``lora`` interface ``adapter`` fits the base version ``base_name`` (model
    ``base_model``) whose recorded interface is ``base``; None when it does.

    In order: the config's base model names the base's model (equal, or its last path part);
    its largest rank is within ``max_rank`` (the serving engines' ``--max-lora-rank``; None:
    unchecked); every adapted module is a tensor of the base of the shape the adapter's
    matrices fit. A ``quantized`` base stores packed weights under other names, so only the
    module's presence is checked there.
    """
    said = adapter.get("base_model")
    if not _names_base(said, base_model):
        shown = quote(str(said), 200) if said else "no base model"
        return BaseMismatch(
            "BaseModelMismatch",
            f"{CONFIG_FILE} names {shown} (base_model_name_or_path) but base ModelVersion {base_name} is "
            f"model {base_model}: an adapter runs only on the base it was trained on",
        )
    rank = int(adapter.get("max_rank") or adapter.get("r") or 0)
    if max_rank is not None and rank > max_rank:
        return BaseMismatch(
            "RankTooLarge",
            f"the adapter's rank r={rank} is over maxLoraRank {max_rank} of base ModelVersion {base_name} "
            "(the engines' --max-lora-rank): engines refuse to load it",
        )
    st = base.get("safetensors")
    if not st:
        return BaseMismatch(
            "BaseShapesUnknown",
            f"base ModelVersion {base_name} has no safetensors weights recorded: an adapter is checked "
            "against the tensor shapes of its base",
        )
    tensors: Mapping[str, str] = st.get("tensors") or {}
    for module, m in (adapter.get("modules") or {}).items():
        weight = f"{module}.weight"
        layout = tensors.get(weight)
        if layout is None:
            if quantized and any(n.startswith(module + ".") for n in tensors):
                continue
            return BaseMismatch(
                "ModuleMissing",
                f"module {module} of the adapter is not in base ModelVersion {base_name} (no tensor "
                f"{weight}): the adapter was trained on another architecture",
            )
        if quantized:
            continue
        if _shape(layout) != list(m["base_shape"]):
            return BaseMismatch(
                "ShapeMismatch",
                f"module {module}: the adapter's lora_A is {m['lora_A']} and lora_B is {m['lora_B']}, "
                f"which fit a base weight of {m['base_shape']}, but base ModelVersion {base_name} has "
                f"{weight} {layout}",
            )
    return None
