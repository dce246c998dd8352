"""SSH transport on paramiko (the engine under fabric): verified host keys, connect retries,
keepalives, ProxyJump, the Ctrl-C escape (``_abandon``), and ``sync`` via rsync with tar/SFTP
fallbacks. Files over SFTP (atomic ``put``, ``get``, the session) are ``ssh_files.SFTPFiles``'.

Only the connection is ever retried; once a command was sent, a lost link is a
``TransportError`` and the caller decides (agent verbs are idempotent by design).

One transport may be used by several threads at once (two verbs on one ``AgentClient``):
exec channels share the connection freely, but opening it is serialized (``_lock``), and so
is the SFTP session (``_sftp_lock``, ``ssh_files``): paramiko's ``SFTPClient`` reads replies
without a lock, so a thread waiting for its reply can swallow another thread's, which then
waits forever.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import IO, Sequence

from orchestrator.errors import ConnectError, HostKeyError, OperationalError, TransportError
from orchestrator.transport import hostkeys
from orchestrator.transport.base import RunResult, rpath, sftp_path  # noqa: F401 (re-exported)
from orchestrator.transport.channel import LinkLost, _paramiko, pump  # noqa: F401 (re-exported)
from orchestrator.transport.ssh_files import SFTPFiles
from orchestrator.transport.ssh_files import reason as _reason
from orchestrator.transport.sshconfig import Endpoint, resolve

KEEPALIVE_S = 10          # like ServerAliveInterval=10
_ATTEMPTS = 3             # connection attempts within one connect_timeout budget
_BACKOFF = (0.3, 0.9)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NULL_HANDLER = logging.NullHandler()


class _Retry(Exception):
    """A connection attempt failed in a way another attempt may fix."""


def _env_prefix(env: dict[str, str] | None) -> str:
    # sshd usually accepts only LANG/LC_* via SetEnv, so export inline (as fabric does).
    if not env:
        return ""
    parts = []
    for key, value in env.items():
        if not _ENV_NAME.match(key):
            raise OperationalError(f"invalid environment variable name {key!r}",
                                   hint="names are letters, digits and _, not starting with a digit")
        parts.append(f"export {key}={shlex.quote(str(value))}; ")
    return "".join(parts)


def _guarded(command: str, has_input: bool) -> str:
    """``command`` wrapped so the box never closes the channel before our EOF reaches it.

    paramiko builds a channel's EOF under the channel's lock but sends it after; when the
    command exits first, its transport thread can answer the box's CLOSE in between, and the
    EOF then follows our CLOSE: OpenSSH drops the whole connection on that ("ieof packet
    referred to nonexistent channel", paramiko #1115 / #1705), and with it every other
    command sharing it (a CI run lost 3 of 8 concurrent verbs so). So a command given no input
    reads /dev/null and is sent no EOF at all (``channel.pump``); one given input has the rest
    of it drained after it exits (the agent-missing branch exits without reading its request),
    so the box closes only after our EOF. POSIX sh, as every command gpurun sends."""
    if not has_input:
        return "{ %s\n} </dev/null" % command
    # a subshell: an ``exit`` in the command (the agent-missing branch) must not skip the drain
    return "( %s\n); __gpurun_rc=$?; cat >/dev/null; exit $__gpurun_rc" % command


class SSHTransport(SFTPFiles):
    """The Transport contract over one SSH connection, opened lazily and reused (its files over
    SFTP: ``SFTPFiles``)."""

    def __init__(self, host_entry: dict, *, known_hosts: str | os.PathLike | None = None,
                 insecure: bool = False, connect_timeout: float = 10):
        _paramiko()  # before resolve(): ~/.ssh/config parsing imports it too
        self.host = host_entry
        self.name = host_entry.get("name") or "ssh-host"
        self.endpoint: Endpoint = resolve(host_entry.get("ssh") or {}, where=f"host {self.name}")
        self.known_hosts = Path(known_hosts) if known_hosts else hostkeys.default_known_hosts()
        # ``gpurun host add --insecure-host-key`` stores the choice in the entry.
        self.insecure = insecure or bool(host_entry.get("insecure_host_key"))
        self.connect_timeout = float(connect_timeout)
        self.rsync_path = (host_entry.get("ssh") or {}).get("rsync_path") or host_entry.get("rsync_path")
        self._tofu = False
        self._seen: list = []
        self._clients: list = []   # jump hops first, target last
        self._sftp = None
        # Reentrant: connect() drops a dead connection under it, and a failing command
        # drops it from another thread. Taken after _sftp_lock, never before it.
        self._lock = threading.RLock()
        self._sftp_lock = threading.RLock()

    # -- connection ------------------------------------------------------------------
    @property
    def _client(self):
        return self._clients[-1] if self._clients else None

    def _alive(self) -> bool:
        client = self._client
        t = client.get_transport() if client is not None else None
        return bool(t is not None and t.is_active())

    def connect(self):
        """Open (or reuse) the connection; ConnectError/HostKeyError if impossible."""
        with self._lock:  # two threads would open two connections, the second via the first
            return self._connect()

    def _connect(self):
        if self._alive():
            return self._client
        self._drop()
        deadline = time.monotonic() + self.connect_timeout
        last = "unknown error"
        for attempt in range(_ATTEMPTS):
            try:
                self._connect_chain(deadline)
                return self._client
            except _Retry as exc:
                last = str(exc)
                self._drop()
            if attempt < len(_BACKOFF) and time.monotonic() + _BACKOFF[attempt] < deadline:
                time.sleep(_BACKOFF[attempt])
            else:
                break
        raise ConnectError(
            f"cannot reach {self.name} ({self.endpoint.label}): {last}",
            hint="check that the box is running and the port is current (rented boxes "
                 f"change ports on restart); `gpurun host show {self.name}` lists what gpurun uses")

    def _connect_chain(self, deadline: float) -> None:
        sock = None
        for hop in (*self.endpoint.jumps, self.endpoint):
            if sock is None and self._clients:
                remaining = max(0.1, deadline - time.monotonic())
                try:
                    sock = self._clients[-1].get_transport().open_channel(
                        "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0),
                        timeout=remaining)
                except Exception as exc:
                    raise _Retry(f"jump host could not reach {hop.label}: {exc}") from None
            self._clients.append(self._open(hop, sock, deadline))
            sock = None

    def _open(self, hop: Endpoint, sock, deadline: float):
        paramiko = _paramiko()

        # paramiko's transport thread logs failed handshakes with a traceback; without a
        # handler Python's last-resort handler would print it on the user's terminal.
        logging.getLogger("paramiko").addHandler(_NULL_HANDLER)

        remaining = max(0.1, deadline - time.monotonic())
        client = paramiko.SSHClient()
        if self.insecure:
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        else:
            client.get_host_keys().update(hostkeys.load(self.known_hosts))
            client.set_missing_host_key_policy(
                hostkeys.make_policy(self.known_hosts, tofu=self._tofu, seen=self._seen))
        try:
            if sock is None and hop.proxy_command:
                sock = paramiko.ProxyCommand(hop.proxy_command)
            if sock is None:
                sock = socket.create_connection((hop.hostname, hop.port), timeout=remaining)
                _tcp_keepalive(sock)
            client.connect(hop.hostname, port=hop.port, username=hop.user,
                           key_filename=list(hop.keys) or None, look_for_keys=not hop.keys,
                           allow_agent=not hop.keys, timeout=remaining, sock=sock,
                           banner_timeout=remaining, auth_timeout=remaining,
                           channel_timeout=remaining)
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise hostkeys.changed_key_error(self.known_hosts, hop.known_hosts_name,
                                             exc.key, exc.expected_key) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise ConnectError(f"{self.name}: authentication failed for {hop.label}: {exc}",
                               hint="check ssh.key / IdentityFile and that the public key is "
                                    "in the box's ~/.ssh/authorized_keys",
                               retryable=False) from None
        except socket.gaierror as exc:
            client.close()
            raise ConnectError(f"cannot resolve {hop.hostname}: {exc.strerror or exc}",
                               hint="check ssh.hostname or the alias in ~/.ssh/config",
                               retryable=False) from None
        except paramiko.SSHException as exc:
            client.close()
            if "authentication methods" not in str(exc):
                if time.monotonic() >= deadline - 0.05:
                    raise _Retry(f"timed out after {self.connect_timeout:g}s with no SSH "
                                 "answer") from None
                raise _Retry(_reason(exc)) from None
            raise ConnectError(f"{self.name}: no usable key for {hop.label}",
                               hint="set ssh.key (gpurun host add --key) or IdentityFile in "
                                    "~/.ssh/config", retryable=False) from None
        except (TimeoutError, socket.timeout):
            client.close()
            raise _Retry(f"timed out after {self.connect_timeout:g}s") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            client.close()
            if time.monotonic() >= deadline - 0.05:  # paramiko words a timeout vaguely
                raise _Retry(f"timed out after {self.connect_timeout:g}s with no SSH "
                             "answer") from None
            raise _Retry(_reason(exc)) from None
        client.get_transport().set_keepalive(KEEPALIVE_S)
        return client

    def _drop(self) -> None:
        with self._lock:
            self._drop_locked()

    def _drop_locked(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:
                pass
        self._sftp = None
        for client in reversed(self._clients):
            try:
                client.close()
            except Exception:
                pass
        self._clients = []

    def server_key(self):
        """The target's host key on the open connection."""
        return self.connect().get_transport().get_remote_server_key()

    # -- commands --------------------------------------------------------------------
    def _channel(self):
        """A fresh session channel. Nothing has been sent yet, so a dead cached connection
        is replaced once."""
        paramiko = _paramiko()

        for attempt in (0, 1):
            client = self.connect()
            try:
                return client.get_transport().open_session(timeout=self.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
                self._drop()
                if attempt:
                    raise ConnectError(f"{self.name}: cannot open an SSH session: {_reason(exc)}",
                                       hint="the box may be overloaded (sshd MaxSessions)") from None
        raise AssertionError("unreachable")

    def run(self, command: str, *, input: str | bytes | None = None,
            timeout: float | None = None, env: dict[str, str] | None = None) -> RunResult:
        data = input.encode() if isinstance(input, str) else input
        return self._exec(_env_prefix(env) + command, data, timeout)

    def _exec(self, command: str, stdin: bytes | IO[bytes] | None,
              timeout: float | None) -> RunResult:
        paramiko = _paramiko()

        try:
            chan = self._channel()
            try:
                chan.exec_command(_guarded(command, stdin is not None))
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop()
                raise TransportError(f"{self.name}: link lost while starting a command: "
                                     f"{_reason(exc)}",
                                     hint="the command may or may not have run; check before "
                                          "repeating it") from None
            try:
                result = self._pump(chan, stdin, timeout)
            except Exception:
                chan.close()
                raise
            chan.close()
            return result
        except Exception:
            raise
        except BaseException:  # Ctrl-C somewhere in paramiko (opening, exec, pump or close)
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Let go of the connection after Ctrl-C struck inside paramiko, taking none of its locks.

        The interrupt can land between a lock's acquire and its ``try`` (a channel's own lock,
        its buffers', its events'), leaving it held for good by this thread; any later close
        waits on it forever: ours at the session's end, or ``Channel.__del__`` when the channel
        is freed, even at exit after ``gpurun: interrupted`` (a `queue submit --wait` hung after
        Ctrl-C). So every channel is marked closed with a no-op close, and the connection's
        thread is ended by shutting its socket: the box sees the link drop."""
        clients, self._clients, self._sftp = self._clients, [], None
        for client in clients:
            transport = client.get_transport()
            client._transport = None      # a later client.close() must not reach paramiko either
            if transport is None:
                continue
            for chan in list(transport._channels._map.values()):  # a weak map: no lock taken
                chan.closed = True
                chan.close = _no_close
            transport.active = False
            sock = transport.sock
            try:
                if isinstance(sock, socket.socket):
                    sock.shutdown(socket.SHUT_RDWR)   # wakes its reader: the thread ends
                elif hasattr(sock, "process"):        # ProxyCommand: SIGTERM, no lock
                    sock.close()
            except OSError:
                pass
            # a jump hop's socket is a channel of the hop before it: gone with that one

    def _pump(self, chan, stdin, timeout: float | None) -> RunResult:
        try:
            return pump(chan, stdin, timeout, self.name)
        except LinkLost:
            self._drop()
            raise TransportError(f"{self.name}: connection lost while a command ran",
                                 hint="the command may have run; check state before repeating") from None

    # -- files: put, get and the SFTP session are SFTPFiles' (ssh_files.py) -----------
    def sync(self, local_dir: str, remote_dir: str, *, excludes: Sequence[str] = ()) -> dict:
        from orchestrator.transport import ssh_sync

        return ssh_sync.sync(self, local_dir, remote_dir, excludes=excludes)

    def check(self) -> None:
        result = self.run("true", timeout=self.connect_timeout)
        if result.exit_code != 0:
            raise ConnectError(f"{self.name}: login shell failed (exit {result.exit_code}): "
                               f"{result.stderr.strip()[-200:]}",
                               hint="check the user's shell and ~/.bashrc on the box")

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> "SSHTransport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def first_contact(host_entry: dict, *, known_hosts: str | os.PathLike | None = None,
                  connect_timeout: float = 10) -> tuple[str, str]:
    """Connect once, recording unknown host keys (trust on first use, also for jump hosts).

    Returns the target's ``(key_type, "SHA256:...")``. A recorded key that differs raises
    HostKeyError; unreachable hosts raise ConnectError. Used by ``gpurun host add``."""
    t = SSHTransport(host_entry, known_hosts=known_hosts, connect_timeout=connect_timeout)
    t._tofu = True
    try:
        key = t.server_key()
        t.check()
        return key.get_name(), hostkeys.fingerprint(key)
    finally:
        t.close()


def _no_close() -> None:
    """``close`` of a channel abandoned after Ctrl-C (``SSHTransport._abandon``)."""


def _tcp_keepalive(sock: socket.socket) -> None:
    # A silently dead link (laptop sleep, NAT drop) is noticed by the kernel in ~25 s.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # Small SSH messages back to back (channel request, stdin, EOF) would otherwise wait
    # for the peer's delayed ACK (40 ms on Linux) each time; OpenSSH sets it too.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt, val in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)
