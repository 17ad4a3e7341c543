"""Small base models and PEFT LoRA adapters as files, for the adapter tests.

:func:`make_base` writes a base model's weights (one safetensors file: token embedding,
attention projections per layer, head), :func:`make_adapter` a PEFT adapter directory
(``adapter_config.json`` and ``adapter_model.safetensors``) whose ``lora_A`` / ``lora_B``
tensors fit (or, with ``bad``, misfit) that base: ``lora_A`` is ``[r, in]``, ``lora_B``
``[out, r]``, for the base module ``[out, in]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

#: The base's shapes: vocabulary, hidden size and the width of k_proj/v_proj (grouped queries).
VOCAB, HIDDEN, KV = 32, 16, 8
LAYERS = 2


def base_shapes(
    *, vocab: int = VOCAB, hidden: int = HIDDEN, kv: int = KV, layers: int = LAYERS
) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the base :func:`make_base` writes."""
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}.self_attn"
        out[f"{p}.q_proj.weight"] = (hidden, hidden)
        out[f"{p}.k_proj.weight"] = (kv, hidden)
        out[f"{p}.v_proj.weight"] = (kv, hidden)
        out[f"{p}.o_proj.weight"] = (hidden, hidden)
        out[f"model.layers.{i}.input_layernorm.weight"] = (hidden,)
    out["lm_head.weight"] = (vocab, hidden)
    return out


def make_base(path: Path, **shapes: int) -> Path:
    """A base model's weights in one safetensors file (see :func:`base_shapes`)."""
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tensors = {n: rng.standard_normal(s).astype(np.float16) for n, s in base_shapes(**shapes).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def make_adapter(
    directory: Path,
    *,
    r: int = 4,
    alpha: int = 8,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    base_model: str = "llama3-8b",
    layers: int = LAYERS,
    hidden: int = HIDDEN,
    kv: int = KV,
    bad: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 1,
    config: Mapping[str, object] | None = None,
) -> Path:
    """A PEFT adapter directory for the base of :func:`make_base` (same ``hidden``/``kv``).

    ``bad`` replaces the shape of named adapter tensors (e.g. a ``lora_B`` of another width);
    ``config`` adds or replaces fields of ``adapter_config.json``. ``seed`` changes the
    weights, so two adapters of one shape have different digests.
    """
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    out_of = {"q_proj": hidden, "o_proj": hidden, "k_proj": kv, "v_proj": kv}
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for i in range(layers):
        for t in targets:
            name = f"base_model.model.model.layers.{i}.self_attn.{t}"
            shapes = {f"{name}.lora_A.weight": (r, hidden), f"{name}.lora_B.weight": (out_of[t], r)}
            for n, s in shapes.items():
                tensors[n] = rng.standard_normal((bad or {}).get(n, s)).astype(np.float16)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    doc: dict[str, object] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": 0.05,
        "target_modules": list(targets),
        "base_model_name_or_path": base_model,
        "bias": "none",
        **(config or {}),
    }
    (directory / "adapter_config.json").write_text(json.dumps(doc, indent=2))
    return directory


def adapter_artifacts(directory: Path) -> list[dict[str, str]]:
    """The ``spec.artifacts`` of an adapter ModelVersion whose files are in ``directory``."""
    return [
        {"format": "lora", "uri": (directory / "adapter_config.json").as_uri()},
        {"format": "lora", "uri": (directory / "adapter_model.safetensors").as_uri()},
    ]
