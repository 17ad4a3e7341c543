"""What the end-to-end images are keyed by, and how the Python base finds this machine's Debian."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinct_testing.controlplane import images
from tinct_testing.controlplane.images import Image
from tinct_testing.paths import ROOT


def test_the_image_key_covers_exactly_what_the_dockerfile_copies() -> None:
    assert images.copied_sources() == ["pyproject.toml", "README.md", "src"]
    files = images.context_files()
    assert ROOT / "pyproject.toml" in files
    assert ROOT / "src" / "tinct" / "cli.py" in files
    assert not [f for f in files if "__pycache__" in f.parts or f.suffix == ".pyc"]
    assert not [f for f in files if f.is_relative_to(ROOT / "tests")], "tests are not in the image"


def test_the_image_key_changes_with_a_source_file_the_base_or_the_dockerfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = Image("localhost/python-base:aaaa", tmp_path / "base.tar")
    key = images.image_key(base)
    assert images.image_key(base) == key
    assert images.image_key(Image("localhost/python-base:bbbb", base.archive)) != key
    src = tmp_path / "src"
    (src / "tinct").mkdir(parents=True)
    (src / "tinct" / "x.py").write_text("x = 1\n")
    for name in ("pyproject.toml", "README.md", "Dockerfile"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    monkeypatch.setattr(images, "ROOT", tmp_path)
    monkeypatch.setattr(images, "DOCKERFILE", tmp_path / "Dockerfile")
    key = images.image_key(base)
    (src / "tinct" / "x.py").write_text("x = 2\n")
    assert images.image_key(base) != key
    key = images.image_key(base)
    (src / "tinct" / "__pycache__").mkdir()
    (src / "tinct" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert images.image_key(base) == key, "byte code is not an input"
    (tmp_path / "Dockerfile").write_text((ROOT / "Dockerfile").read_text() + "\nLABEL x=y\n")
    assert images.image_key(base) != key


def test_image_reference_parts() -> None:
    image = Image("localhost/tinct:0123abcd", Path("/x.tar"))
    assert (image.repository, image.tag) == ("localhost/tinct", "0123abcd")


def test_mirror_of_a_suite_from_one_line_and_deb822_sources() -> None:
    one_line = "# comment\ndeb [arch=amd64] http://mirror.example/debian bookworm main contrib\n"
    assert images._serves(one_line, "bookworm") == "http://mirror.example/debian"
    assert images._serves(one_line, "trixie") is None
    deb822 = (
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://security.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    assert images._serves(deb822, "bookworm") == "http://deb.debian.org/debian"
    assert images._serves(deb822, "bookworm-security") == "http://security.example/debian-security"
    disabled = "Types: deb\nURIs: http://x/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n"
    assert images._serves(disabled, "bookworm") is None
    sources_only = "Types: deb-src\nURIs: http://x/debian\nSuites: bookworm\nComponents: main\n"
    assert images._serves(sources_only, "bookworm") is None
