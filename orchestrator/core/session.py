"""Opening a host: its inventory entry, the transport that reaches it, and the agent client.

``open_session`` is how every use case talks to a host; the verbs themselves are the typed
methods of ``orchestrator.core.client.AgentClient``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from orchestrator import hosts as hostinv
from orchestrator.core.client import AgentClient


def make_transport(host: dict) -> Any:
    """The transport for ``host``: this machine directly, anything else over SSH."""
    if host.get("kind", "local") == "local":
        from orchestrator.transport.local import LocalTransport
        return LocalTransport(host)
    from orchestrator.transport.ssh import SSHTransport
    return SSHTransport(host)


@contextmanager
def open_session(host_name: str | None = None, *, host: dict | None = None) -> Iterator[AgentClient]:
    """An agent client for the named host (or the given entry), closed on exit."""
    entry = host or hostinv.get_host(host_name)
    client = AgentClient(entry, make_transport(entry))
    try:
        yield client
    finally:
        client.close()
