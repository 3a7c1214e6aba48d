"""Load the scripts of client_examples/ (a folder of scripts, not a package) by file path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

CLIENT_DIR = Path(__file__).resolve().parents[3] / "client_examples"


def load_client_module(name: str) -> ModuleType:
    """Import ``client_examples/<name>.py`` the way an integration test would."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, CLIENT_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_client():
    """The loader itself, for tests that pick the script by parameter."""
    return load_client_module


@pytest.fixture(scope="session")
def common() -> ModuleType:
    return load_client_module("hps_client_common")


@pytest.fixture(scope="session")
def perf_input() -> ModuleType:
    return load_client_module("make_perf_input")
