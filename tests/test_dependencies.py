"""The declared dependencies match the code (docs/ARCHITECTURE.md, "Dependencies"): every base
package is imported somewhere, nothing undeclared is, an extra's package is imported only
inside the function that needs it, and the ``test`` extra pulls in every optional feature."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "orchestrator"
# distribution name -> the module it provides
MODULE = {"paramiko": "paramiko", "invoke": "invoke", "pyyaml": "yaml", "click": "click", "psutil": "psutil",
          "nvidia-ml-py": "pynvml", "rich": "rich", "boto3": "boto3", "matplotlib": "matplotlib",
          "numpy": "numpy", "botocore": "botocore"}
PROVIDED_BY = {"botocore": "boto3"}  # imported directly, installed by the named distribution
# used when the user's own environment has them (never installed by gpurun, each with a fallback):
# numpy (safetensors NaN scan), torch (checkpoint load check), wandb (online runs), crc32c (fast CRC)
WHEN_PRESENT = {"numpy", "torch", "wandb", "crc32c"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(reqs: list) -> set:
    return {re.split(r"[<>=!~\[; ]", r, 1)[0].lower() for r in reqs}


def _imports() -> dict:
    """top-level module -> [(file, at_module_level)] for every third-party import in the package."""
    out: dict = {}
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for m in mods:
                root = m.split(".")[0]
                if root in sys.stdlib_module_names or root in ("orchestrator", "__future__"):
                    continue
                out.setdefault(root, []).append((str(path.relative_to(ROOT)), id(node) in top))
    return out


def test_every_base_dependency_is_used_and_nothing_undeclared_is_imported():
    proj = _project()
    base = _names(proj["dependencies"])
    extras = {k: _names(v) for k, v in proj["optional-dependencies"].items()}
    imports = _imports()
    for dist in base:
        assert MODULE[dist] in imports, f"{dist} is a base dependency but no module imports it"
    declared = {MODULE[d] for d in base | extras["s3"] | extras["plot"]}
    for mod, sites in imports.items():
        if mod in WHEN_PRESENT:
            assert not any(top for _, top in sites), f"{mod} must stay optional: {sites}"
            continue
        owner = PROVIDED_BY.get(mod, mod)
        assert mod in declared or MODULE.get(owner) in declared, f"{mod} imported by {sites[0][0]} but not declared"
    assert "fabric" not in imports and "fabric" not in base  # see ARCHITECTURE.md, "Dependencies"


def test_extras_are_imported_lazily_and_only_where_documented():
    imports = _imports()
    for mod, files in (("boto3", {"orchestrator/sync/s3.py"}), ("botocore", {"orchestrator/sync/s3.py"}),
                       ("matplotlib", {"orchestrator/quality/plot.py", "orchestrator/core/check.py"})):
        sites = imports.get(mod, [])
        assert sites, mod
        assert {f for f, _ in sites} <= files, (mod, sites)
        assert not any(top for _, top in sites), f"{mod} imported at module level: {sites}"


def test_test_extra_covers_every_optional_feature():
    extras = {k: _names(v) for k, v in _project()["optional-dependencies"].items()}
    assert extras["s3"] == {"boto3"} and extras["plot"] == {"matplotlib"}
    assert extras["s3"] | extras["plot"] | extras["examples"] <= extras["test"]


def test_cold_cli_imports_no_heavy_or_optional_package():
    code = ("import sys\nfrom orchestrator.cli.main import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write('LOADED:' + ' '.join(m for m in ('boto3', 'matplotlib', 'psutil', 'pynvml',"
            " 'paramiko', 'invoke', 'fabric') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout and out.stderr.strip().endswith("LOADED:"), out.stderr
