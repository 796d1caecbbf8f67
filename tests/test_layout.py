"""The package's shape: dependencies run one way (toy -> method), and the README's layout matches the tree."""

from __future__ import annotations

import ast
from pathlib import Path

import seed_vl

PACKAGE = Path(seed_vl.__file__).parent
REPO = PACKAGE.parent


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules |= {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


def test_no_module_of_the_method_imports_the_toy():
    front_door = {"cli.py"}  # dispatches commands to both
    core = [p for p in PACKAGE.glob("*.py") if p.name not in front_door]
    core += [p for root in ("envs", "processors") for p in (REPO / root).rglob("*.py")]
    offenders = {
        str(p.relative_to(REPO)): sorted(m for m in imported_modules(p) if m.startswith("seed_vl.toy"))
        for p in core
    }
    assert len(core) > 20
    assert {p: m for p, m in offenders.items() if m} == {}


def test_readme_layout_names_every_module():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    missing = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py" and p.name not in layout]
    assert missing == []
    assert "toy/" in layout and all(name in readme for name in ("tiny model", "warm start", "reproduction"))
