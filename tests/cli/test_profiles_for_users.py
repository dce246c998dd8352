"""``gpurun profiles show`` speaks to users: the facts and the provider's public docs, never
the design notes' references (``source: remote-gpu-trainer ...``) or trap ids (``(RP1)``)."""

from __future__ import annotations

import json
import re

import pytest

from rigs.agents import gpurun

SHIPPED = ("autodl", "generic-ssh", "lambda", "local", "paperspace", "runpod", "vastai")
INTERNAL = re.compile(r"remote-gpu-trainer|anchor-and-platforms|dependencies-and-test-rigs|§|"
                      r"\((?:RP|VAST|LAM|PS|GEN|ADL|AD|LOC)\d+")


@pytest.mark.parametrize("name", SHIPPED)
def test_show_has_no_internal_references(isolated_home, name):
    res = gpurun("profiles", "show", name)
    assert res.returncode == 0, res.stderr
    assert not INTERNAL.search(res.stdout), INTERNAL.search(res.stdout)
    assert "source:" not in res.stdout
    plain = json.loads(gpurun("profiles", "show", name, "--json").stdout)["plain"]
    assert not any(INTERNAL.search(t) for t in plain["traps"] + plain["meter"] + plain["danger_clocks"])


def test_rented_providers_link_their_public_docs(isolated_home):
    for name, host in (("runpod", "docs.runpod.io"), ("vastai", "docs.vast.ai"), ("lambda", "docs.lambda.ai"),
                       ("autodl", "autodl.com"), ("paperspace", "docs.digitalocean.com")):
        out = gpurun("profiles", "show", name).stdout
        (line,) = [x for x in out.splitlines() if x.strip().startswith("docs:")]
        assert line.strip().startswith("docs: https://") and host in line
    res = gpurun("profiles", "show", "runpod")
    # the facts themselves are still there, only the id is gone
    assert "Trap: A stopped pod is pinned to its host and may restart with zero GPUs." in res.stdout
    assert "docs:" not in gpurun("profiles", "show", "generic-ssh").stdout   # nobody's docs to link
