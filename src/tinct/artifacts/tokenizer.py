"""The ``tokenizer`` artifact format: ``tokenizer.json`` and ``tokenizer_config.json``.

Either file is a JSON object of at most :data:`MAX_SIZE` bytes. A ``tokenizer.json``
(as the ``tokenizers`` library writes it) has a ``model`` object with a ``vocab`` (a
token -> id object for BPE, WordPiece and WordLevel; a list of ``[token, score]`` pairs
for Unigram) and ``added_tokens``. A ``tokenizer_config.json`` names the special tokens
by role (``bos_token``, ``eos_token``, ...) and may carry a ``chat_template``.

Facts (see :func:`tokenizer_facts`):

- ``tokenizer.json``: ``vocab_size`` (distinct ids of the vocabulary and the added
  tokens), ``vocab_digest`` (SHA-256 of the sorted ``id<TAB>token`` lines) and the special
  added tokens (``special_tokens``: content -> id);
- ``tokenizer_config.json``: the special tokens by role (``special_tokens``: role ->
  content) and ``chat_template_digest`` (SHA-256 of the template text, or of the JSON of
  named templates; None without a template).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from tinct.artifacts.formats import json_document

__all__ = ["MAX_SIZE", "tokenizer_facts"]

#: Largest tokenizer file read (a 256k-token BPE vocabulary with merges is ~20 MB).
MAX_SIZE = 64 * 1024 * 1024

_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _content(token: Any) -> str | None:
    """A special token as the config writes it: a string, or an object with ``content``."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return str(token["content"])
    return None


def _vocab(model: dict[str, Any]) -> dict[int, str]:
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in vocab.values()):
            raise ValueError("model.vocab ids must be non-negative integers")
        return {i: str(t) for t, i in vocab.items()}
    if isinstance(vocab, list):  # Unigram: [[token, score], ...]; the id is the position
        out: dict[int, str] = {}
        for i, entry in enumerate(vocab):
            if not isinstance(entry, list) or not entry or not isinstance(entry[0], str):
                raise ValueError(f"model.vocab[{i}] is not a [token, score] pair")
            out[i] = entry[0]
        return out
    raise ValueError("model has no vocab (an object of token -> id, or a list of [token, score])")


def _tokenizer_json(doc: dict[str, Any]) -> dict[str, Any]:
    model = doc["model"]
    vocab = _vocab(model)
    special: dict[str, str] = {}
    added = doc.get("added_tokens") or []
    if not isinstance(added, list):
        raise ValueError("added_tokens is not a list")
    for i, tok in enumerate(added):
        if (
            not isinstance(tok, dict)
            or not isinstance(tok.get("id"), int)
            or not isinstance(tok.get("content"), str)
        ):
            raise ValueError(f"added_tokens[{i}] has no integer id and string content")
        vocab.setdefault(tok["id"], tok["content"])
        if tok.get("special"):
            special[tok["content"]] = str(tok["id"])
    lines = "\n".join(f"{i}\t{t}" for i, t in sorted(vocab.items()))
    return {
        "file": "tokenizer.json",
        "model": str(model.get("type") or ""),
        "vocab_size": len(vocab),
        "vocab_digest": _sha256(lines),
        "special_tokens": dict(sorted(special.items())),
    }


def _tokenizer_config(doc: dict[str, Any]) -> dict[str, Any]:
    special: dict[str, str] = {}
    for role in _ROLES:
        content = _content(doc.get(role))
        if content is not None:
            special[role] = content
    extra = doc.get("additional_special_tokens")
    if isinstance(extra, list):
        names = [c for c in (_content(t) for t in extra) if c is not None]
        if names:
            special["additional_special_tokens"] = json.dumps(names, ensure_ascii=False)
    template = doc.get("chat_template")
    if template is None or template == "":
        digest = None
    elif isinstance(template, str):
        digest = _sha256(template)
    elif isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        digest = _sha256(json.dumps(template, sort_keys=True, ensure_ascii=False))
    else:
        raise ValueError("chat_template is neither a string nor a list of named templates")
    return {
        "file": "tokenizer_config.json",
        "special_tokens": dict(sorted(special.items())),
        "chat_template_digest": digest,
    }


def tokenizer_facts(uri: str, size: int, read: Callable[[], bytes]) -> dict[str, Any]:
    """Check a tokenizer file of ``size`` bytes and return its facts; ``read`` reads it whole.

    Raises:
        ValueError: the file is too big, not a JSON object, or not shaped like either file.
    """
    if size > MAX_SIZE:
        raise ValueError(
            f"{size} bytes exceeds the {MAX_SIZE // (1024 * 1024)} MiB a tokenizer file may have"
        )
    doc = json_document(read())
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if isinstance(doc.get("model"), dict):
        return _tokenizer_json(doc)
    if uri.rstrip("/").endswith("tokenizer.json"):
        raise ValueError('tokenizer.json has no "model" object')
    return _tokenizer_config(doc)
