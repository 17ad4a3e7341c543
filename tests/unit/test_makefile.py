"""``make help`` is generated from the Makefile's own comments, so it lists every target."""

from __future__ import annotations

import re
import subprocess

from tinct_testing.paths import ROOT


def _targets() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return re.findall(r"^([a-z][a-z0-9-]*):", text, re.M)


def test_every_target_has_a_description_and_make_help_lists_it() -> None:
    text = (ROOT / "Makefile").read_text()
    undocumented = [t for t in _targets() if not re.search(rf"^{t}:.*## \S", text, re.M)]
    assert not undocumented, f"targets without a `## what it does` comment: {undocumented}"
    out = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True, text=True, check=True)
    listed = re.findall(r"^make (\S+)\s+\S", out.stdout, re.M)
    assert listed == _targets(), out.stdout


def test_every_phony_target_exists_and_every_target_is_phony() -> None:
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M)
    assert phony is not None
    assert sorted(phony.group(1).split()) == sorted(_targets())
