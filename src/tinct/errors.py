"""The shape most of tinct's errors share: what a message is about, and what is wrong with it.

Only the standard library is imported, so any module (the CLI's fast path included) can
build on it.
"""

from __future__ import annotations

__all__ = ["AboutError"]


class AboutError(Exception):
    """Something (``about``: a URI, a kubeconfig, a value a person gave) and what is wrong with
    it (``detail``); the message is ``<about>: <detail>``."""

    def __init__(self, about: str, detail: str) -> None:
        super().__init__(about, detail)
        self.about = about
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.about}: {self.detail}"
