"""``python -m orchestrator.cli`` runs the gpurun CLI (used by tests and benchmarks)."""

from orchestrator.cli.main import main

main()
