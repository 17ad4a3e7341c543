"""Differences between two interfaces, each classified, and the semver bump they need.

The classification is one table, :data:`RULES`: a CamelCase ``kind`` -> its class
(``breaking``, ``additive`` or ``none``) and what it means. :func:`diff` compares two
interfaces (:mod:`~tinct.artifacts.interface`) and returns every
:class:`Difference`; :func:`measured_bump` is the smallest semver bump that allows them
(any breaking difference: MAJOR; any additive one: MINOR; else PATCH), and
:func:`verdict` says whether a declared ``old -> new`` version number allows what was
measured.

ONNX and PTX files are paired by file name; when each side has one file of a format they
are paired whatever their names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from tinct.artifacts.interface import Interface

__all__ = [
    "BUMPS",
    "RULES",
    "Bump",
    "Difference",
    "Level",
    "Rule",
    "Verdict",
    "declared_bump",
    "diff",
    "measured_bump",
    "verdict",
]

Level = Literal["breaking", "additive", "none"]
Bump = Literal["major", "minor", "patch"]
#: Bumps from smallest to largest.
BUMPS: tuple[Bump, ...] = ("patch", "minor", "major")
_NEEDS: dict[Level, Bump] = {"breaking": "major", "additive": "minor", "none": "patch"}


@dataclass(frozen=True)
class Rule:
    level: Level
    meaning: str


#: Every kind of difference and its class. The table of docs/concepts/modelversions.md is this one.
RULES: dict[str, Rule] = {
    # any format
    "ArtifactRemoved": Rule("breaking", "a format, or an ONNX/PTX file, the old version had is gone"),
    "ArtifactAdded": Rule("additive", "a format, or an ONNX/PTX file, the old version did not have"),
    "MetadataAdded": Rule("additive", "a new ONNX metadata property or safetensors __metadata__ key"),
    "MetadataChanged": Rule("none", "a metadata value changed or was removed"),
    # onnx
    "InputRemoved": Rule("breaking", "a graph input is gone (or renamed)"),
    "InputAdded": Rule("breaking", "a new required graph input"),
    "OptionalInputAdded": Rule("additive", "a new graph input backed by an initializer"),
    "InputBecameRequired": Rule("breaking", "an input lost the initializer that made it optional"),
    "OutputRemoved": Rule("breaking", "a graph output is gone (or renamed)"),
    "OutputAdded": Rule("additive", "a new graph output"),
    "DtypeChanged": Rule("breaking", "an input's or output's element type changed"),
    "RankChanged": Rule("breaking", "an input's or output's number of dimensions changed"),
    "FixedDimensionChanged": Rule(
        "breaking", "a fixed dimension changed, became symbolic on an output, or a symbolic one became fixed"
    ),
    "InputDimensionRelaxed": Rule("additive", "a fixed input dimension became symbolic (accepts more)"),
    "DimensionRenamed": Rule("none", "a symbolic dimension has another name"),
    "OpsetRaised": Rule("breaking", "an opset version went up (the runtime must support it)"),
    "OpsetAdded": Rule("breaking", "a new operator domain (the runtime must provide it)"),
    "OpsetLowered": Rule("none", "an opset version went down or a domain is no longer used"),
    # safetensors
    "TensorRemoved": Rule("breaking", "tensor layout changed: a tensor is gone"),
    "TensorAdded": Rule("breaking", "tensor layout changed: a new tensor (strict loaders refuse it)"),
    "TensorLayoutChanged": Rule("breaking", "tensor layout changed: a tensor's dtype or shape"),
    "VocabSizeChanged": Rule("breaking", "the vocabulary size (embedding rows, or the tokenizer's) changed"),
    "HiddenSizeChanged": Rule("breaking", "the hidden size (embedding width) changed"),
    "LayerCountChanged": Rule("breaking", "the number of layers changed"),
    # ptx
    "EntryRemoved": Rule("breaking", "a PTX .entry kernel is gone"),
    "EntryAdded": Rule("additive", "a new PTX .entry kernel"),
    "TargetRaised": Rule("breaking", "a higher sm target: older GPUs cannot load it"),
    "TargetLowered": Rule("none", "a lower sm target: runs on more GPUs"),
    "AddressSizeChanged": Rule("breaking", ".address_size changed"),
    "PtxVersionRaised": Rule("breaking", "a higher PTX ISA .version: needs a newer driver"),
    "PtxVersionLowered": Rule("none", "a lower PTX ISA .version"),
    # tokenizer
    "VocabularyChanged": Rule("breaking", "the vocabulary (tokens or their ids) changed"),
    "SpecialTokensChanged": Rule("breaking", "a special token was added, removed or changed"),
    "ChatTemplateChanged": Rule("breaking", "the chat template was added, removed or changed"),
    # lora
    "AdapterBaseChanged": Rule("breaking", "a LoRA adapter trained on another base model"),
    "AdapterModulesChanged": Rule("none", "a LoRA adapter adapts other modules or has another rank"),
}

#: At most this many names are listed in one difference; the rest are counted.
_MAX_NAMES = 10


@dataclass(frozen=True)
class Difference:
    kind: str
    where: str  # e.g. "onnx model.onnx input attention_mask"
    detail: str

    @property
    def level(self) -> Level:
        return RULES[self.kind].level

    def __str__(self) -> str:
        return f"{self.level} {self.kind}: {self.where}: {self.detail}"

    def wire(self) -> dict[str, str]:
        return {"kind": self.kind, "level": self.level, "where": self.where, "detail": self.detail}


def _names(names: Iterable[str]) -> str:
    items = sorted(names)
    shown = ", ".join(items[:_MAX_NAMES])
    return shown + (f" and {len(items) - _MAX_NAMES} more" if len(items) > _MAX_NAMES else "")


def _shape(shape: list[Any] | None) -> str:
    if shape is None:
        return "[?]"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _tensor(facts: dict[str, Any]) -> str:
    return f"{facts['dtype']}{_shape(facts['shape'])}"


def _pairs(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(name, old facts or None, new facts or None) of the files of one format."""
    if len(old) == 1 and len(new) == 1:
        (on, of), (nn, nf) = next(iter(old.items())), next(iter(new.items()))
        return [(nn if on == nn else f"{on} -> {nn}", of, nf)]
    return [(n, old.get(n), new.get(n)) for n in sorted(set(old) | set(new))]


def _dims(out: list[Difference], where: str, old: list[Any], new: list[Any], *, is_input: bool) -> None:
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        if a == b:
            continue
        if isinstance(a, int) and not isinstance(b, int) and is_input:
            out.append(Difference("InputDimensionRelaxed", where, f"dimension {i}: {a} -> {b or '?'}"))
        elif isinstance(a, str) and isinstance(b, str):
            out.append(Difference("DimensionRenamed", where, f"dimension {i}: {a} -> {b}"))
        elif isinstance(a, int) or isinstance(b, int):
            out.append(Difference("FixedDimensionChanged", where, f"dimension {i}: {a or '?'} -> {b or '?'}"))


def _values(
    out: list[Difference], where: str, old: dict[str, Any], new: dict[str, Any], *, is_input: bool
) -> None:
    what = "input" if is_input else "output"
    for name in sorted(set(old) - set(new)):
        kind = "InputRemoved" if is_input else "OutputRemoved"
        out.append(Difference(kind, f"{where} {what} {name}", f"{_tensor(old[name])} removed"))
    for name in sorted(set(new) - set(old)):
        if is_input:
            kind = "OptionalInputAdded" if new[name].get("optional") else "InputAdded"
        else:
            kind = "OutputAdded"
        out.append(Difference(kind, f"{where} {what} {name}", f"{_tensor(new[name])} added"))
    for name in sorted(set(old) & set(new)):
        a, b = old[name], new[name]
        at = f"{where} {what} {name}"
        if a["dtype"] != b["dtype"]:
            out.append(Difference("DtypeChanged", at, f"{a['dtype']} -> {b['dtype']}"))
        sa, sb = a.get("shape"), b.get("shape")
        if sa is not None and sb is not None:
            if len(sa) != len(sb):
                out.append(Difference("RankChanged", at, f"{_shape(sa)} -> {_shape(sb)}"))
            else:
                _dims(out, at, sa, sb, is_input=is_input)
        elif sa != sb:
            kind = "InputDimensionRelaxed" if is_input and sb is None else "FixedDimensionChanged"
            out.append(Difference(kind, at, f"{_shape(sa)} -> {_shape(sb)}"))
        if is_input and a.get("optional") and not b.get("optional"):
            out.append(Difference("InputBecameRequired", at, "no initializer backs it any more"))


def _metadata(out: list[Difference], where: str, old: dict[str, str], new: dict[str, str]) -> None:
    added = sorted(set(new) - set(old))
    if added:
        out.append(Difference("MetadataAdded", where, f"new key(s) {_names(added)}"))
    changed = sorted(k for k in old if new.get(k) != old[k])
    if changed:
        out.append(Difference("MetadataChanged", where, f"changed or removed key(s) {_names(changed)}"))


def _onnx(out: list[Difference], name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    where = f"onnx {name}"
    _values(out, where, old["inputs"], new["inputs"], is_input=True)
    _values(out, where, old["outputs"], new["outputs"], is_input=False)
    for domain in sorted(set(old["opsets"]) | set(new["opsets"])):
        a, b = old["opsets"].get(domain), new["opsets"].get(domain)
        at = f"{where} opset {domain}"
        if a is None:
            out.append(Difference("OpsetAdded", at, f"version {b} imported"))
        elif b is None or b < a:
            out.append(Difference("OpsetLowered", at, f"{a} -> {b if b is not None else 'not imported'}"))
        elif b > a:
            out.append(Difference("OpsetRaised", at, f"{a} -> {b}"))
    _metadata(out, f"{where} metadata", old["metadata"], new["metadata"])


def _sm(target: str) -> tuple[int, str]:
    m = re.fullmatch(r"sm_(\d+)([a-z]?)", target)
    return (int(m.group(1)), m.group(2)) if m else (0, target)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit())


def _ptx(out: list[Difference], name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    where = f"ptx {name}"
    removed = set(old["entries"]) - set(new["entries"])
    added = set(new["entries"]) - set(old["entries"])
    if removed:
        out.append(Difference("EntryRemoved", f"{where} entries", _names(removed)))
    if added:
        out.append(Difference("EntryAdded", f"{where} entries", _names(added)))
    if old["target"] != new["target"]:
        kind = "TargetRaised" if _sm(new["target"]) > _sm(old["target"]) else "TargetLowered"
        out.append(Difference(kind, f"{where} .target", f"{old['target']} -> {new['target']}"))
    if old["address_size"] != new["address_size"]:
        out.append(
            Difference(
                "AddressSizeChanged",
                f"{where} .address_size",
                f"{old['address_size']} -> {new['address_size']}",
            )
        )
    if old["version"] != new["version"]:
        kind = (
            "PtxVersionRaised" if _version(new["version"]) > _version(old["version"]) else "PtxVersionLowered"
        )
        out.append(Difference(kind, f"{where} .version", f"{old['version']} -> {new['version']}"))


def _safetensors(out: list[Difference], old: dict[str, Any], new: dict[str, Any]) -> None:
    where = "safetensors"
    a, b = old["tensors"], new["tensors"]
    removed, added = set(a) - set(b), set(b) - set(a)
    changed = sorted(n for n in set(a) & set(b) if a[n] != b[n])
    if removed:
        out.append(Difference("TensorRemoved", f"{where} tensors", f"{len(removed)}: {_names(removed)}"))
    if added:
        out.append(Difference("TensorAdded", f"{where} tensors", f"{len(added)}: {_names(added)}"))
    if changed:
        shown = ", ".join(f"{n} {a[n]} -> {b[n]}" for n in changed[:_MAX_NAMES])
        more = f" and {len(changed) - _MAX_NAMES} more" if len(changed) > _MAX_NAMES else ""
        out.append(Difference("TensorLayoutChanged", f"{where} tensors", f"{len(changed)}: {shown}{more}"))
    for key, kind in (
        ("vocab_size", "VocabSizeChanged"),
        ("hidden_size", "HiddenSizeChanged"),
        ("layers", "LayerCountChanged"),
    ):
        if old.get(key) != new.get(key):
            out.append(Difference(kind, f"{where} {key}", f"{old.get(key)} -> {new.get(key)}"))
    _metadata(out, f"{where} metadata", old["metadata"], new["metadata"])


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "none"


def _tokenizer(out: list[Difference], old: dict[str, Any], new: dict[str, Any]) -> None:
    where = "tokenizer"
    if old["vocab_size"] != new["vocab_size"]:
        out.append(
            Difference(
                "VocabSizeChanged", f"{where} vocab_size", f"{old['vocab_size']} -> {new['vocab_size']}"
            )
        )
    if old["vocab_digest"] != new["vocab_digest"]:
        out.append(
            Difference(
                "VocabularyChanged",
                f"{where} vocabulary",
                f"digest {_short(old['vocab_digest'])} -> {_short(new['vocab_digest'])}",
            )
        )
    a, b = old["special_tokens"], new["special_tokens"]
    if a != b:
        parts = []
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                parts.append(f"{k}: {a.get(k, '-')} -> {b.get(k, '-')}")
        shown = "; ".join(parts[:_MAX_NAMES]) + (
            f" and {len(parts) - _MAX_NAMES} more" if len(parts) > _MAX_NAMES else ""
        )
        out.append(Difference("SpecialTokensChanged", f"{where} special tokens", shown))
    if old["chat_template_digest"] != new["chat_template_digest"]:
        out.append(
            Difference(
                "ChatTemplateChanged",
                f"{where} chat template",
                f"digest {_short(old['chat_template_digest'])} -> {_short(new['chat_template_digest'])}",
            )
        )


def _lora(out: list[Difference], old: dict[str, Any], new: dict[str, Any]) -> None:
    if old.get("base_model") != new.get("base_model"):
        out.append(
            Difference(
                "AdapterBaseChanged", "lora", f"base model {old.get('base_model')} -> {new.get('base_model')}"
            )
        )
    shape = {k: v["rank"] for k, v in (old.get("modules") or {}).items()}
    if shape != {k: v["rank"] for k, v in (new.get("modules") or {}).items()}:
        out.append(
            Difference(
                "AdapterModulesChanged",
                "lora",
                f"{len(shape)} modules of rank {old.get('r')} -> {len(new.get('modules') or {})} of rank "
                f"{new.get('r')}",
            )
        )


def diff(old: Interface, new: Interface) -> list[Difference]:
    """Every difference from ``old`` to ``new``, breaking ones first."""
    out: list[Difference] = []
    for fmt in sorted(set(old) | set(new)):
        if fmt not in new:
            out.append(Difference("ArtifactRemoved", fmt, f"the new version has no {fmt} artifact"))
            continue
        if fmt not in old:
            out.append(Difference("ArtifactAdded", fmt, f"the old version had no {fmt} artifact"))
            continue
        if fmt == "safetensors":
            _safetensors(out, old[fmt], new[fmt])
        elif fmt == "tokenizer":
            _tokenizer(out, old[fmt], new[fmt])
        elif fmt == "lora":
            _lora(out, old[fmt], new[fmt])
        elif fmt in ("onnx", "ptx"):
            for name, a, b in _pairs(old[fmt], new[fmt]):
                if b is None:
                    out.append(Difference("ArtifactRemoved", f"{fmt} {name}", "file removed"))
                elif a is None:
                    out.append(Difference("ArtifactAdded", f"{fmt} {name}", "file added"))
                elif fmt == "onnx":
                    _onnx(out, name, a, b)
                else:
                    _ptx(out, name, a, b)
    order = {"breaking": 0, "additive": 1, "none": 2}
    return sorted(out, key=lambda d: order[d.level])


def measured_bump(diffs: Iterable[Difference]) -> Bump:
    """The smallest bump the differences allow."""
    need = 0
    for d in diffs:
        need = max(need, BUMPS.index(_NEEDS[d.level]))
    return BUMPS[need]


_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def _triple(version: str) -> tuple[int, int, int] | None:
    m = _SEMVER.match(version)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def declared_bump(old: str, new: str) -> Bump | None:
    """The bump from version ``old`` to ``new``; None when ``new`` is not above ``old`` in
    MAJOR.MINOR.PATCH (a pre-release of the same numbers counts as a PATCH step)."""
    a, b = _triple(old), _triple(new)
    if a is None or b is None or b < a:
        return None
    if b[0] != a[0]:
        return "major"
    if b[1] != a[1]:
        return "minor"
    return "patch"


@dataclass(frozen=True)
class Verdict:
    declared: Bump | None
    measured: Bump
    differences: list[Difference]

    @property
    def ok(self) -> bool:
        """The declared bump allows the measured one."""
        return self.declared is not None and BUMPS.index(self.declared) >= BUMPS.index(self.measured)

    @property
    def breaking(self) -> bool:
        return any(d.level == "breaking" for d in self.differences)

    def explain(self, old: str, new: str) -> str:
        """One sentence: what was declared, what was measured, and what to do."""
        if self.declared is None:
            return f"{new} is not above {old}"
        if self.ok:
            return f"{old} -> {new} is a {self.declared.upper()} step; the interface needs {self.measured.upper()}"
        count = sum(1 for d in self.differences if _NEEDS[d.level] == self.measured)
        return (
            f"{old} -> {new} is declared {self.declared.upper()} but the interface changed as "
            f"{self.measured.upper()} ({count} {'breaking' if self.measured == 'major' else 'additive'} "
            f"difference(s)): it cannot be released as declared; publish it as a {self.measured.upper()} version"
        )


def verdict(old_version: str, new_version: str, old: Interface, new: Interface) -> Verdict:
    """Compare ``new`` (declared ``new_version``) with ``old`` (``old_version``)."""
    diffs = diff(old, new)
    return Verdict(declared_bump(old_version, new_version), measured_bump(diffs), diffs)
