"""What pyproject.toml, scripts/setup.sh and the README promise about Python and the server."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def project_minimum() -> Version:
    """The lower bound of ``requires-python`` (written as ``>=X.Y``)."""
    spec = PYPROJECT["project"]["requires-python"]
    match = re.fullmatch(r">=\s*(\d+\.\d+)", spec)
    assert match, f"requires-python {spec!r} is not of the form >=X.Y"
    return Version(match.group(1))


def test_setup_script_checks_the_same_python() -> None:
    script = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    check = re.search(r"sys\.version_info < \((\d+), (\d+)\)", script)
    assert check, "scripts/setup.sh no longer checks sys.version_info"
    assert Version(f"{check.group(1)}.{check.group(2)}") == project_minimum()
    minimum = f"Python >= {project_minimum()}"
    said = re.findall(r"Python >= \d+\.\d+", script)
    assert said and set(said) == {minimum}, said


@pytest.mark.parametrize(
    "requirement", PYPROJECT["project"]["dependencies"], ids=lambda r: Requirement(r).name
)
def test_dependencies_run_on_the_oldest_python_allowed(requirement: str) -> None:
    # pip would refuse the pinned version on an older Python than its Requires-Python.
    name = Requirement(requirement).name
    try:
        needs = metadata(name)["Requires-Python"]
    except PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    if needs:
        assert project_minimum() in SpecifierSet(needs), f"{name} needs Python {needs}"


def test_readme_explains_the_gpu_probe_lines_of_a_cpu_machine() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    serve = readme.index("`hps serve` binds")
    for line in ("CudaDriverHelper has not been initialized", "Failed to initialize NVML"):
        at = readme.find(line, serve)
        assert at != -1, line
        assert "harmless" in readme[at : at + 300]
