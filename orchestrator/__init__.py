"""gpurun: a remote GPU job orchestrator.

This package root stays import-free: the on-host agent ships ``orchestrator/agent``,
``orchestrator/quality`` and ``orchestrator/health`` inside a zipapp next to this file,
and those must import on a bare Python 3.8 with nothing else installed.
"""

__version__ = "0.1.0"
