"""Reply framing between the agent and the CLI.

The agent prints its JSON reply between two sentinels; the client ignores everything
outside them, so a chatty ``.bashrc``, a motd or a Python warning cannot corrupt a reply.
Stdlib only: the agent imports this module too (it is vendored into the agent zipapp as
``orchestrator.agent.framing``; keep the two byte-identical by importing from there).
"""

from orchestrator.agent.framing import BEGIN, END, frame, unframe  # noqa: F401
