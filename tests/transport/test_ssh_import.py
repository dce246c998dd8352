"""paramiko is imported without invoke (cold CLI cost), and ``Match exec`` still gets it lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = r"""
import sys, threading
from orchestrator.transport.ssh import _paramiko
mods = []
ts = [threading.Thread(target=lambda: mods.append(_paramiko())) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
assert len(mods) == 8 and all(m is mods[0] for m in mods) and hasattr(mods[0], "SSHClient")
print("invoke" in sys.modules)
try:
    import invoke
except ImportError:
    print("no-invoke")
else:
    print(mods[0].config.invoke.run is invoke.run)
"""


def test_paramiko_without_invoke_then_lazy():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.split()
    assert first == "False"  # not imported by paramiko at startup
    if second == "no-invoke":
        pytest.skip("invoke is not installed")
    assert second == "True"  # Match exec would reach the real invoke.run
