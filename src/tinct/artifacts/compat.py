"""Quantization x runtime compatibility gate.

The gate is a table of rules. Each :class:`Rule` has a CamelCase ``reason`` (it becomes
the reason of the ``Compatible=False`` condition), a predicate over the quantization and
runtime, and a message telling the user what to change. To add a rule, append one to
:data:`RULES`; to teach tinct that a runtime gained a method, edit
:data:`RUNTIME_METHODS`.

Policy encoded here (tinct's, conservative; adjust as runtimes evolve):

================================  ==========================================================
reason                            rule
================================  ==========================================================
MethodUnsupportedByRuntime        the runtime cannot serve the method (see RUNTIME_METHODS;
                                  e.g. FP8 on onnxruntime or llama-cpp)
AsymmetricAWQUnsupported          AWQ with ``symmetric: false`` on tensorrt-llm
GroupSizeRequired                 4-bit (or fewer) AWQ/GPTQ without ``groupSize``
BitsMismatch                      bits that the method does not produce (fp8 != 8 bits,
                                  int8/smoothquant != 8, awq/gptq not in 2..8)
================================  ==========================================================

No runtime (``spec.runtime`` unset) checks only the runtime-independent rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tinct.api.v1alpha1.modelversion import Quantization

__all__ = ["RULES", "RUNTIME_METHODS", "Rule", "Violation", "check"]

#: Quantization methods each runtime serves. "none" means unquantized weights.
RUNTIME_METHODS: dict[str, frozenset[str]] = {
    "tensorrt-llm": frozenset({"none", "awq", "gptq", "fp8", "int8", "smoothquant"}),
    "vllm": frozenset({"none", "awq", "gptq", "fp8", "int8", "smoothquant"}),
    "tgi": frozenset({"none", "awq", "gptq", "fp8"}),
    "triton": frozenset({"none", "awq", "gptq", "fp8", "int8", "smoothquant"}),
    "onnxruntime": frozenset({"none", "int8", "gptq", "awq"}),
    "llama-cpp": frozenset({"none", "int8"}),
}


@dataclass(frozen=True)
class Violation:
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True)
class Rule:
    """``applies(quantization, runtime)`` returns a message when the pair is rejected."""

    reason: str
    applies: Callable[[Quantization, str | None], str | None]


def _method_unsupported(q: Quantization, runtime: str | None) -> str | None:
    if runtime is None or q.method in RUNTIME_METHODS.get(runtime, frozenset({q.method})):
        return None
    served = ", ".join(sorted(RUNTIME_METHODS[runtime]))
    return f"runtime {runtime} does not serve {q.method} quantization (it serves: {served})"


def _asymmetric_awq(q: Quantization, runtime: str | None) -> str | None:
    if runtime == "tensorrt-llm" and q.method == "awq" and not q.symmetric:
        return "tensorrt-llm accepts only symmetric AWQ; re-quantize with symmetric: true or pick vllm"
    return None


def _group_size(q: Quantization, runtime: str | None) -> str | None:
    if q.method in ("awq", "gptq") and (q.bits or 4) <= 4 and q.group_size is None:
        return f"{q.bits or 4}-bit {q.method} needs quantization.groupSize (e.g. 128)"
    return None


_EXPECTED_BITS: dict[str, frozenset[int]] = {
    "fp8": frozenset({8}),
    "int8": frozenset({8}),
    "smoothquant": frozenset({8}),
    "awq": frozenset({2, 3, 4, 8}),
    "gptq": frozenset({2, 3, 4, 8}),
    "none": frozenset({16}),
}


def _bits(q: Quantization, runtime: str | None) -> str | None:
    allowed = _EXPECTED_BITS.get(q.method)
    if q.bits is None or allowed is None or q.bits in allowed:
        return None
    want = ", ".join(str(b) for b in sorted(allowed))
    return f"{q.method} quantization has {want} bits, not {q.bits}"


#: Every rule, checked in order; all violations are reported.
RULES: list[Rule] = [
    Rule("MethodUnsupportedByRuntime", _method_unsupported),
    Rule("AsymmetricAWQUnsupported", _asymmetric_awq),
    Rule("GroupSizeRequired", _group_size),
    Rule("BitsMismatch", _bits),
]


def check(quantization: Quantization | None, runtime: str | None) -> list[Violation]:
    """All rules ``quantization`` x ``runtime`` breaks; empty when compatible."""
    q = quantization or Quantization()
    out: list[Violation] = []
    for rule in RULES:
        message = rule.applies(q, runtime)
        if message:
            out.append(Violation(rule.reason, message))
    return out
