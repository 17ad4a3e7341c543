"""The ``tokenizer`` artifact format: ``tokenizer.json`` and ``tokenizer_config.json``.

Either file is a JSON object of at most :data:`~tinct.artifacts.limits.TOKENIZER_MAX_BYTES`,
read as a stream (:mod:`~tinct.artifacts.jsonstream`). A ``tokenizer.json`` (as the
``tokenizers`` library writes it) has a ``model`` object with a ``vocab`` (a token -> id
object for BPE, WordPiece and WordLevel; a list of ``[token, score]`` pairs for Unigram) and
``added_tokens``. A ``tokenizer_config.json`` names the special tokens by role
(``bos_token``, ``eos_token``, ...) and may carry a ``chat_template``.

Facts (see :func:`tokenizer_facts`):

- ``tokenizer.json``: ``vocab_size`` (distinct ids of the vocabulary and the added
  tokens), ``vocab_digest`` (SHA-256 of the sorted ``id<TAB>token`` lines; for an id given
  twice, the vocabulary's last token, else the first added one) and the special added
  tokens (``special_tokens``: content -> id);
- ``tokenizer_config.json``: the special tokens by role (``special_tokens``: role ->
  content) and ``chat_template_digest`` (SHA-256 of the template text, or of the JSON of
  named templates; None without a template).

The vocabulary is not kept as Python objects: each entry is an id and the token's UTF-8
bytes in flat arrays (at most :data:`~tinct.artifacts.limits.TOKENIZER_MAX_VOCAB`
entries), sorted by id with numpy and hashed in batches. The merges and everything else
the interface does not need are skipped as they stream past.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from typing import Any

import numpy as np

from tinct.artifacts.jsonstream import JsonStream
from tinct.artifacts.limits import (
    CHAT_TEMPLATE_MAX_CHARS,
    JSON_MAX_TOKEN,
    SPECIAL_TOKEN_MAX_CHARS,
    TOKENIZER_MAX_BYTES,
    TOKENIZER_MAX_SPECIAL,
    TOKENIZER_MAX_VOCAB,
    LimitExceededError,
)
from tinct.artifacts.reading import Facts, Window

__all__ = ["tokenizer_facts"]

_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
#: Units (characters and values) of one vocabulary entry or added token: its token, whose
#: length JSON_MAX_TOKEN bounds already, and a few small fields.
_ENTRY_UNITS = JSON_MAX_TOKEN + 4096
#: Units of a special token as a config names it: a string or ``{"content": ..., flags}``.
_SPECIAL_UNITS = SPECIAL_TOKEN_MAX_CHARS + 1024
#: Entries of the vocabulary taken from the arrays at a time, and bytes hashed at a time.
_BATCH = 65536
_HASH_BYTES = 4 * 1024 * 1024


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


class _Vocabulary:
    """Ids and tokens in flat arrays: what the digest needs, not a dict of strings."""

    def __init__(self) -> None:
        self._ids = array("q")
        self._added = array("b")
        self._offsets = array("q", [0])  # token i is _text[_offsets[i]:_offsets[i + 1]]
        self._text = bytearray()

    def add(self, token_id: int, token: str, *, added: bool) -> None:
        if len(self._ids) >= TOKENIZER_MAX_VOCAB:
            raise LimitExceededError(
                "more vocabulary entries and added tokens",
                "TOKENIZER_MAX_VOCAB",
                TOKENIZER_MAX_VOCAB,
                "entries",
            )
        self._ids.append(token_id)
        self._added.append(added)
        self._text += token.encode("utf-8", "surrogatepass")
        self._offsets.append(len(self._text))

    def digest(self) -> tuple[int, str]:
        """``(distinct ids, SHA-256 of the id<TAB>token lines in id order)``."""
        sha = hashlib.sha256()
        n = len(self._ids)
        if not n:
            return 0, sha.hexdigest()
        ids = np.frombuffer(self._ids, dtype=np.int64)
        seq = np.arange(n, dtype=np.int64)
        # Per id: the vocabulary's last entry wins, else the first added token.
        rank = np.where(np.frombuffer(self._added, dtype=np.int8) == 0, -seq, seq + n)
        order = np.lexsort((rank, ids))
        del rank, seq
        first = np.ones(n, dtype=bool)
        first[1:] = ids[order[1:]] != ids[order[:-1]]
        chosen = order[first]
        del order, first
        offsets = np.frombuffer(self._offsets, dtype=np.int64)
        text = memoryview(self._text)
        for k in range(0, len(chosen), _BATCH):
            part = chosen[k : k + _BATCH]
            starts, stops = offsets[part], offsets[part + 1]
            rows = zip(ids[part].tolist(), starts.tolist(), stops.tolist(), strict=True)
            if int((stops - starts).sum()) <= _HASH_BYTES:  # the usual: short tokens, one update
                sha.update((b"\n" if k else b"") + b"\n".join(b"%d\t" % i + text[s:e] for i, s, e in rows))
                continue
            for j, (i, s, e) in enumerate(rows):  # long tokens: one at a time, never a copy of all
                sha.update(b"%b%d\t" % (b"\n" if k or j else b"", i))
                sha.update(text[s:e])
        return len(chosen), sha.hexdigest()


def _content(token: Any) -> str | None:
    """A special token as the config writes it: a string, or an object with ``content``."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return str(token["content"])
    return None


def _special(content: str, count: int) -> str:
    """``content`` as the ``count``-th special token kept, within the caps."""
    if len(content) > SPECIAL_TOKEN_MAX_CHARS:
        raise LimitExceededError(
            f"a special token of {len(content):,} characters",
            "SPECIAL_TOKEN_MAX_CHARS",
            SPECIAL_TOKEN_MAX_CHARS,
            "characters",
        )
    if count > TOKENIZER_MAX_SPECIAL:
        raise LimitExceededError(
            "more special tokens", "TOKENIZER_MAX_SPECIAL", TOKENIZER_MAX_SPECIAL, "tokens"
        )
    return content


class _Reader:
    """One pass over either file, keeping what both kinds need; which kind it is, and so
    which complaints count, is known only at the end (``model`` may come last)."""

    def __init__(self, doc: JsonStream) -> None:
        self.doc = doc
        self.vocab = _Vocabulary()
        self.model: str | None = None  # model.type, once a model object was read
        self.has_vocab = False
        self.added: dict[str, str] = {}
        self.roles: dict[str, str] = {}
        self.template: str | None = None
        self.json_errors: list[str] = []  # what makes it an invalid tokenizer.json
        self.config_errors: list[str] = []  # ... an invalid tokenizer_config.json

    def read(self) -> None:
        doc = self.doc
        for key in doc.object_keys():
            if key == "model" and doc.kind() == "object":
                if self.model is not None:
                    raise ValueError('"model" appears twice')
                self._model()
            elif key == "added_tokens":
                self._added_tokens()
            elif key in _ROLES:
                content = _content(doc.value(_SPECIAL_UNITS, key, "SPECIAL_TOKEN_MAX_CHARS"))
                if content is not None:
                    self.roles[key] = _special(content, len(self.roles) + 1)
            elif key == "additional_special_tokens" and doc.kind() == "array":
                self._additional()
            elif key == "chat_template":
                self._chat_template()
            else:
                doc.skip()
        doc.end()

    def _model(self) -> None:
        doc = self.doc
        self.model = ""
        for key in doc.object_keys():
            if key == "type":
                value = doc.value(4096, "model.type")
                self.model = str(value or "")
            elif key == "vocab" and doc.kind() == "object":
                self.has_vocab = True
                for token in doc.object_keys():
                    token_id = doc.value(64, "model.vocab id")
                    if not _is_id(token_id):
                        raise ValueError("model.vocab ids must be non-negative integers")
                    self.vocab.add(token_id, token, added=False)
            elif key == "vocab" and doc.kind() == "array":  # Unigram: [[token, score], ...]
                self.has_vocab = True
                for i in doc.array_items():
                    entry = doc.value(_ENTRY_UNITS, f"model.vocab[{i}]")
                    if not isinstance(entry, list) or not entry or not isinstance(entry[0], str):
                        raise ValueError(f"model.vocab[{i}] is not a [token, score] pair")
                    self.vocab.add(i, entry[0], added=False)
            else:
                doc.skip()

    def _added_tokens(self) -> None:
        doc = self.doc
        if doc.kind() != "array":
            if doc.kind() != "null":
                self.json_errors.append("added_tokens is not a list")
            doc.skip()
            return
        for i in doc.array_items():
            tok = doc.value(_ENTRY_UNITS, f"added_tokens[{i}]")
            if (
                not isinstance(tok, dict)
                or not _is_id(tok.get("id"))
                or not isinstance(tok.get("content"), str)
            ):
                self.json_errors.append(
                    f"added_tokens[{i}] has no non-negative integer id and string content"
                )
                continue
            self.vocab.add(tok["id"], tok["content"], added=True)
            if tok.get("special"):
                self.added[_special(tok["content"], len(self.added) + 1)] = str(tok["id"])

    def _additional(self) -> None:
        names: list[str] = []
        for _ in self.doc.array_items():
            content = _content(
                self.doc.value(_SPECIAL_UNITS, "additional_special_tokens", "SPECIAL_TOKEN_MAX_CHARS")
            )
            if content is not None:
                names.append(_special(content, len(names) + 1))
        if names:
            self.roles["additional_special_tokens"] = json.dumps(names, ensure_ascii=False)

    def _chat_template(self) -> None:
        template = self.doc.value(CHAT_TEMPLATE_MAX_CHARS, "chat_template", "CHAT_TEMPLATE_MAX_CHARS")
        if template is None or template == "":
            self.template = None
        elif isinstance(template, str):
            self.template = _sha256(template)
        elif isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            self.template = _sha256(json.dumps(template, sort_keys=True, ensure_ascii=False))
        else:
            self.config_errors.append("chat_template is neither a string nor a list of named templates")

    def tokenizer_json(self) -> Facts:
        if not self.has_vocab:
            raise ValueError("model has no vocab (an object of token -> id, or a list of [token, score])")
        if self.json_errors:
            raise ValueError(self.json_errors[0])
        size, digest = self.vocab.digest()
        return {
            "file": "tokenizer.json",
            "model": self.model or "",
            "vocab_size": size,
            "vocab_digest": digest,
            "special_tokens": dict(sorted(self.added.items())),
        }

    def tokenizer_config(self) -> Facts:
        if self.config_errors:
            raise ValueError(self.config_errors[0])
        return {
            "file": "tokenizer_config.json",
            "special_tokens": dict(sorted(self.roles.items())),
            "chat_template_digest": self.template,
        }


def tokenizer_facts(uri: str, win: Window) -> Facts:
    """Check the tokenizer file in ``win`` and return its facts.

    Raises:
        ValueError: the file is not a JSON object, or not shaped like either file.
        LimitExceededError: the file is over a cap (checked before reading, where it can be).
    """
    if win.size > TOKENIZER_MAX_BYTES:
        raise LimitExceededError(f"{win.size:,} bytes", "TOKENIZER_MAX_BYTES", TOKENIZER_MAX_BYTES, "bytes")
    reader = _Reader(JsonStream(win.stream(0, win.size)))
    reader.read()
    if reader.model is not None:
        return reader.tokenizer_json()
    if uri.rstrip("/").endswith("tokenizer.json"):
        raise ValueError('tokenizer.json has no "model" object')
    return reader.tokenizer_config()
