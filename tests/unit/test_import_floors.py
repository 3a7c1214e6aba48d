"""Each folder of ``hps_core`` is one floor: no import runs back up.

A *room* is a top-level module of ``hps_core`` (``hps_core/hps.py`` is room ``hps_core.hps``)
or a package folder with the modules directly in it (``hps_core/nn/layers/__init__.py`` and
``hps_core/nn/layers/dense.py`` are both room ``hps_core.nn.layers``). Room A imports room B
when a module of A imports a module of B, at module level or inside a function: a lazy import
runs back up as surely as an eager one, only later. ``from pkg import name`` imports the
submodule ``pkg.name`` where there is one, else ``pkg`` itself. Imports of the ``hps_core``
package itself (its ``__init__``) are left out.

A *floor* is a room's height: rooms that import no other room are on floor 0, and every other
room is one floor above the highest room it imports. That is only defined when no room imports
itself back through others, which is what this test checks: a package may import its
subpackages (room ``hps_core.nn`` imports ``hps_core.nn.layers``), but then nothing in them
may import the package or its top-level modules.
"""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "hps_core"
PACKAGES = (PACKAGE, "triton_backend")
"""The library and the Triton models built on it (one room: its modules sit in one folder)."""


def module_name(path: Path) -> str:
    """``hps_core/nn/layers/dense.py`` -> ``hps_core.nn.layers.dense``; a package's
    ``__init__.py`` is named after its folder."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_package(name: str) -> bool:
    """Whether ``name`` is a package: a folder of Python modules (``hps_core/cuda/kernels/``
    holds CUDA sources; ``hps_core.cuda.kernels`` is the module ``kernels.py``)."""
    path = ROOT / name.replace(".", "/")
    return (path / "__init__.py").is_file()


def existing_module(name: str) -> str | None:
    """``name`` when it is a module or package of the tree, else None."""
    path = ROOT / name.replace(".", "/")
    return name if is_package(name) or path.with_suffix(".py").is_file() else None


def room_of(module: str) -> str:
    """The room of a module: a package is its own room, a top-level module of ``hps_core`` is
    one, and any other module belongs to the package folder it is in."""
    if is_package(module):
        return module
    parent = module.rsplit(".", 1)[0]
    return module if parent == PACKAGE else parent  # triton_backend's modules: its room


def imported_modules(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, int]]:
    """The ``hps_core`` modules a module's code imports, anywhere in it, with their lines."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = existing_module(alias.name)
                if target is not None:
                    found.append((target, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package upwards
                anchor = module.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = existing_module(f"{base}.{alias.name}") or existing_module(base)
                if target is not None:
                    found.append((target, node.lineno))
    return [
        (t, line) for t, line in found if any(t == p or t.startswith(p + ".") for p in PACKAGES)
    ]


def room_graph() -> tuple[set[str], dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """The rooms, which rooms each imports, and where (``file:line``) each such import is."""
    rooms: set[str] = set()
    edges: dict[str, set[str]] = collections.defaultdict(set)
    sites: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for path in sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        module = module_name(path)
        source = room_of(module)
        rooms.add(source)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target, line in imported_modules(tree, module, path.name == "__init__.py"):
            room = room_of(target)
            if room not in (source, PACKAGE):
                edges[source].add(room)
                site = f"{path.relative_to(ROOT)}:{line}"
                if site not in sites[(source, room)]:
                    sites[(source, room)].append(site)
    return rooms, edges, sites


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    """The rooms ``start`` imports, directly or through others."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        for room in edges.get(stack.pop(), ()):
            if room not in seen:
                seen.add(room)
                stack.append(room)
    return seen


def test_rooms_are_floors_no_import_cycle() -> None:
    rooms, edges, sites = room_graph()
    assert f"{PACKAGE}.nn.layers" in rooms, f"found no package folders under {ROOT / PACKAGE}"
    in_cycles = sorted(
        (source, target)
        for source in rooms
        for target in edges.get(source, ())
        if source in reachable(edges, target)
    )
    report = "\n".join(
        f"  {source} -> {target}: {', '.join(sites[(source, target)])}"
        for source, target in in_cycles
    )
    assert not in_cycles, f"{len(in_cycles)} imports between rooms in cycles:\n{report}"


def test_cuda_primitives_import_nothing_above_the_errors() -> None:
    """``hps_core.cuda`` is the bottom floor of the GPU code: ``nn``, ``cache`` and
    ``infer.gpu`` build on it, and it on :mod:`hps_core.errors` alone."""
    _, edges, sites = room_graph()
    above = sorted(edges[f"{PACKAGE}.cuda"] - {f"{PACKAGE}.errors"})
    assert not above, [sites[(f"{PACKAGE}.cuda", room)] for room in above]


def test_the_library_never_imports_the_triton_models() -> None:
    """``triton_backend`` (the Triton models) sits on ``hps_core``; nothing below imports it."""
    _, edges, sites = room_graph()
    users = sorted(room for room, targets in edges.items() if "triton_backend" in targets)
    assert not [u for u in users if u != "triton_backend"], {
        u: sites[(u, "triton_backend")] for u in users
    }
    assert f"{PACKAGE}.infer" in edges["triton_backend"]  # the scan sees its imports


def floors() -> dict[str, int]:
    """Each room's floor: 0 for a room that imports no other, else one above its highest."""
    rooms, edges, _ = room_graph()
    floor: dict[str, int] = {}

    def height(room: str) -> int:
        if room not in floor:
            floor[room] = 1 + max((height(r) for r in edges.get(room, ())), default=-1)
        return floor[room]

    for room in rooms:
        height(room)
    return floor


def test_the_readmes_table_of_floors_is_the_code_s() -> None:
    """README's layout table lists every room of ``hps_core`` and ``triton_backend`` on the
    floor the imports put it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("| floor | packages |") :].split("\n\n", 1)[0]
    written: dict[str, int] = {}
    for line in table.splitlines()[2:]:
        number, packages = line.strip("|").split("|", 1)
        for name in re.findall(r"`([\w/]+)`", re.sub(r"\([^)]*\)", "", packages)):
            room = name.rstrip("/") if name.startswith("triton_backend") else f"{PACKAGE}.{name}"
            written[room.replace("/", ".")] = int(number)
    assert written == {room: f for room, f in floors().items() if room != PACKAGE}
