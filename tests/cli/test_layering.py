"""The layering rule of DESIGN.md, checked on the source: ``cli/`` is click commands that reach
the rest of gpurun only through ``core/`` (use cases), and nothing below the CLI imports it.

Both scans read every import statement with ``ast``: top-level, inside functions, under
``TYPE_CHECKING``, relative ones resolved against the module's package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import orchestrator

PKG = Path(orchestrator.__file__).parent
CLI = PKG / "cli"
# what a cli module may import from gpurun (``orchestrator.__version__`` as ``from orchestrator import``)
CLI_ALLOWED = ("orchestrator.core", "orchestrator.cli", "orchestrator.errors")
CLI_ALLOWED_NAMES = {"__version__"}
LOWER_ROOMS = ("core", "agent", "health", "quality", "sync", "transport", "providers")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, module: str | None = None) -> list[tuple[int, str, list[str]]]:
    """``(line, absolute module, names)`` for every import in ``path`` (whose dotted name is
    ``module``, default: from its place in the package); names is empty for ``import X`` and
    lists the imported names for ``from X import a, b``."""
    module = module or _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([mod] if mod else []))
            found.append((node.lineno, mod, [a.name for a in node.names]))
    return sorted(found)


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def cli_violations(path: Path, module: str | None = None) -> list[str]:
    bad = []
    for line, mod, names in imports(path, module):
        if not _under(mod, "orchestrator"):
            continue  # click, rich, the stdlib
        if any(_under(mod, p) for p in CLI_ALLOWED):
            continue
        if mod == "orchestrator" and names:
            # `from orchestrator import core` names a package: it must be an allowed one
            wrong = [n for n in names if n not in CLI_ALLOWED_NAMES
                     and not any(_under(f"orchestrator.{n}", p) for p in CLI_ALLOWED)]
            if not wrong:
                continue
            mod = f"orchestrator ({', '.join(wrong)})"
        bad.append(f"{path.name}:{line}: imports {mod}")
    return bad


def test_the_scan_sees_function_level_relative_and_aliased_imports(tmp_path):
    # the scanner itself: a cli module that breaks the rule in every way must be caught
    probe = tmp_path / "probe.py"
    probe.write_text("import orchestrator.hosts\n"
                     "from orchestrator import hosts as inv, __version__, core\n"
                     "from orchestrator.core import queue\n"
                     "from orchestrator.errors import BadInput\n"
                     "def f():\n"
                     "    from orchestrator.quality.judge import EXIT_CODES\n"
                     "    from ..sync import keep\n"
                     "    from . import render\n"
                     "    import orchestrator.core.check\n")
    found = [v.split(": imports ")[1] for v in cli_violations(probe, "orchestrator.cli.probe")]
    assert found == ["orchestrator.hosts", "orchestrator (hosts)", "orchestrator.quality.judge",
                     "orchestrator.sync"]


def cli_modules() -> list[Path]:
    return sorted(CLI.glob("*.py"))


@pytest.mark.parametrize("path", cli_modules(), ids=lambda p: p.name)
def test_cli_imports_only_core_cli_errors_and_version(path):
    assert cli_violations(path) == []


def test_nothing_below_the_cli_imports_it():
    for room in LOWER_ROOMS:
        assert (PKG / room).is_dir(), f"room {room}/ moved: update this test"
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if CLI in path.parents:
            continue
        for line, mod, names in imports(path):
            if _under(mod, "orchestrator.cli") or (mod == "orchestrator" and "cli" in names):
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: imports {mod}")
    assert bad == []
