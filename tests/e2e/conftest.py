"""The README's example queue, run once for the session and shared by the tests that read it.

Running ``examples/queue.txt`` to the end costs ~10 s of real training; ``test_readme`` (the
README's first command works) and ``test_newcomer_queue`` (what the newcomer then sees) both
judge that same run, so it is run once, in a home of its own, and each test reads it there.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from rigs.agents import kill_agents_under, point_home

ROOT = Path(__file__).resolve().parents[2]


def readme_first_command() -> str:
    """The README's first bash block: ``pip install ... && <the commands a newcomer runs>``."""
    return re.search(r"```bash\n(pip install [^\n]+)\n```", (ROOT / "README.md").read_text()).group(1)


@pytest.fixture(scope="session")
def _example_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    pytest.importorskip("numpy")
    rest = readme_first_command().split(" && ", 1)[1]   # the install itself is what CI just did
    home = tmp_path_factory.mktemp("example") / "home"
    with pytest.MonkeyPatch.context() as mp:
        point_home(mp, home)
        # bash runs the ";"-separated commands one after the other; running them one by one the
        # same way keeps each one's exit code (the submit's is what --wait promises)
        steps = [subprocess.run(["bash", "-c", part], cwd=ROOT, capture_output=True, text=True, timeout=300,
                                env=dict(os.environ)) for part in rest.split("; ")]
    yield {"home": home, "commands": rest.split("; "), "steps": steps}
    kill_agents_under(home)


@pytest.fixture
def example_run(_example_run: dict, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The README's example queue run to the end on ``local`` (once per session; read it, do not
    change it), this test's home pointed at it. ``steps``: each command's CompletedProcess."""
    point_home(monkeypatch, _example_run["home"])
    return _example_run
