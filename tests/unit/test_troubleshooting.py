"""docs/troubleshooting.md has a section for every reason the operator can set, and no other."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from tinct.api.v1alpha1.grayrelease import GrayReleasePhase
from tinct_testing.paths import ROOT
from tinct_testing.reasons import reasons

DOC = ROOT / "docs" / "troubleshooting.md"


def sections(text: str) -> list[str]:
    return re.findall(r"^### (\w+)$", text, re.M)


def test_every_reason_has_a_section() -> None:
    found = reasons(ROOT / "src" / "tinct")
    assert len(found) > 50, "the source scan found too few reasons: has their shape changed?"
    documented = sections(DOC.read_text())
    assert sorted(found - set(documented)) == [], "reasons without a section in docs/troubleshooting.md"
    # A phase is a reason too (Ready=False and Progressing=False carry it); nothing else is.
    phases = set(typing.get_args(GrayReleasePhase))
    assert sorted(set(documented) - found - phases) == [], "sections of reasons tinct never sets"
    assert len(documented) == len(set(documented)), "a reason documented twice"


def test_the_scan_finds_each_shape(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "Problem('BackendsAvailable', 'ServiceGone', 'the Service is gone')\n"
        "Transition('Jumped', 'step 2/4')\n"
        "Condition(type='X', status='True', reason='AllFine' if ok else 'NotFine')\n"
        "self.condition('AnalysisPassing', 'False', 'Broke', 'it broke')\n"
        "t = ('False', 'Degraded2', 'msg')\n"
        "analysis = ('Quiet', f'no metrics for {x}')\n"
    )
    assert reasons(tmp_path) == {"ServiceGone", "Jumped", "AllFine", "NotFine", "Broke", "Degraded2", "Quiet"}
