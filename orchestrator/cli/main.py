"""Entry point of the ``gpurun`` command.

Subcommands load lazily (``LAZY`` maps a name to ``module:attribute``) so ``gpurun --help``
and quick verbs do not pay for fabric, boto3 or rich. ``main`` is the one place where a
``GpurunError`` becomes a one-line message, a hint and an exit code.

When the invoked command takes ``--json`` and the command line has it, a failure is printed on
stdout as ``{"error": {"code", "message", "hint"}}`` instead (the exit code is the same), so
``gpurun X --json | jq`` always sees one JSON document. Without ``--json`` the human form
(``gpurun: error: ...`` and ``  hint: ...`` on stderr) is unchanged. Usage errors (a typo in a
command or option, a bad option value) take the same form: one line naming the option, and a
hint pointing at the command's ``--help``, never click's four-line usage block. Ctrl-C (exit
130) and a stdout that cannot be written (``> /dev/full``, exit 1) are one line as well.
"""

from __future__ import annotations

import sys

try:
    import importlib
    import json
    import os
    from typing import Any

    import click

    from orchestrator import __version__
    from orchestrator.errors import CLI_CODES, GpurunError
except KeyboardInterrupt:  # Ctrl-C while gpurun loads (most of its first 0.1 s): nothing began
    sys.stderr.write("gpurun: interrupted\n")
    raise SystemExit(130) from None

# name -> (module:attr, one-line help). Help text is here so --help imports nothing else.
LAZY: dict[str, tuple[str, str]] = {
    "queue": ("orchestrator.cli.queue:queue", "Submit, inspect, cancel and retry queued jobs."),
    "host": ("orchestrator.cli.host:host", "Manage the host inventory (local, SSH boxes)."),
    "fleet": ("orchestrator.cli.fleet:fleet", "Group hosts into named fleets (add, ls, rm)."),
    "profiles": ("orchestrator.cli.profiles:profiles", "List and show provider profiles."),
    "push": ("orchestrator.cli.push:push", "Send a project directory to a host."),
    "setup": ("orchestrator.cli.setup:setup", "Check and prepare a fresh box for a provider."),
    "check": ("orchestrator.cli.check:check", "Judge a training run from its metrics."),
    "gpu": ("orchestrator.cli.gpu:gpu", "GPU health verdict for a host."),
    "watch": ("orchestrator.cli.watch:watch", "Live view of hosts, GPUs and jobs."),
    "reap": ("orchestrator.cli.reap:reap", "Find (and with --kill, reap) VRAM zombies."),
    "pull": ("orchestrator.cli.pull:pull", "Bring artifacts home, verified."),
    "down": ("orchestrator.cli.down:down", "Stop the meter, only after results are verified."),
    "up": ("orchestrator.cli.up:up", "Rent a GPU box through a provider API."),
    "ls": ("orchestrator.cli.ls:ls", "List rented instances with state and cost."),
    "recover": ("orchestrator.cli.recover:recover", "Recover a preempted box: wait, restart or replace it."),
    "agent": ("orchestrator.cli.agent:agent", "Show or stop the agent daemon on a host."),
    "secret": ("orchestrator.cli.secret:secret", "Put secrets on a host for jobs that ask for them by name."),
}


class _Interrupted(Exception):
    """Ctrl-C inside a command, carried past click: click would print a bare newline on stderr
    and raise Abort, and ``main`` prints the one ``gpurun: interrupted`` line itself."""


class LazyGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            if ctx.parent is not None:  # a nested group: let the root turn it into _Interrupted
                raise
            raise _Interrupted() from exc

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | {n for n in LAZY if _available(n)})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in LAZY:
            return cmd
        target = LAZY[name][0]
        mod_name, attr = target.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name == mod_name:
                return None
            raise
        return getattr(mod, attr)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                            list[str]]:
        # click suggests from registered commands only; ours load lazily, so suggest here
        name = args[0] if args else ""
        if name and not name.startswith("-") and not ctx.resilient_parsing and self.get_command(ctx, name) is None:
            ctx.fail(f"No such command {name!r}.{_suggestion(name, self.list_commands(ctx))}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, LAZY[n][1]) for n in sorted(LAZY) if _available(n)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# words people type at the top level that live under `gpurun queue`
QUEUE_VERBS = ("submit", "status", "logs", "cancel", "retry", "events")


def _suggestion(name: str, commands: list[str]) -> str:
    """`` Did you mean 'queue'?`` for a near miss (difflib), or for a queue verb typed at the
    top level (``gpurun status``); empty when nothing is close."""
    if name in QUEUE_VERBS:
        return f" Did you mean 'queue {name}'?"
    import difflib
    close = difflib.get_close_matches(name, commands, n=2, cutoff=0.6)
    if not close:
        verb = difflib.get_close_matches(name, QUEUE_VERBS, n=1, cutoff=0.75)
        return f" Did you mean 'queue {verb[0]}'?" if verb else ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def _available(name: str) -> bool:
    mod = LAZY[name][0].split(":")[0]
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), *mod.split(".")[1:]) + ".py"
    return os.path.exists(path)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpurun")
def cli() -> None:
    """gpurun: run a queue of training commands on any GPU box, detached, watched,
    judged, and brought home verified.

    Start with:  gpurun queue submit examples/queue.txt --wait
    """


def _leaf_command(args: list[str]) -> click.Command | None:
    """The command the line ``args`` invokes (parsed leniently: no callbacks, no errors), or
    None when it names no command (e.g. a typo in the subcommand)."""
    return _resolve_line(args)[0]


def _resolve_line(args: list[str]) -> tuple[click.Command | None, click.Context]:
    """The command ``args`` invokes (None: it names none) and the context reached on the way,
    whose ``command_path`` is the deepest command named (``gpurun queue status``)."""
    cmd: click.Command = cli
    ctx = cli.make_context("gpurun", list(args), resilient_parsing=True)
    while isinstance(cmd, click.Group):
        protected = getattr(ctx, "_protected_args", None)
        if protected is None:  # click < 8.2
            protected = getattr(ctx, "protected_args", [])
        rest = [*protected, *ctx.args]
        if not rest:
            return cmd, ctx
        name, sub, rest = cmd.resolve_command(ctx, rest)
        if sub is None:
            return None, ctx
        ctx = sub.make_context(name or sub.name or "", rest, parent=ctx, resilient_parsing=True)
        cmd = sub
    return cmd, ctx


def _json_requested(args: list[str]) -> bool:
    """Whether this command line asked for ``--json``: the token appears before any ``--``,
    after the subcommand (``gpurun --json ...`` is not a JSON request: the root has no such
    option), and the invoked command declares ``--json``. Never raises."""
    head = args[:args.index("--")] if "--" in args else args
    if "--json" not in head:
        return False
    first_word = next((i for i, a in enumerate(head) if not a.startswith("-")), None)
    if first_word is None or "--json" not in head[first_word + 1:]:
        return False
    try:
        leaf = _leaf_command(args)
    except Exception:  # noqa: BLE001 - a line we cannot even resolve: trust the token
        return True
    if leaf is None:  # unknown subcommand: still a usage error the script should see as JSON
        return True
    return any("--json" in getattr(p, "opts", ()) for p in leaf.params)


class _OutputError(Exception):
    """Writing to stdout failed (no space, I/O error): one error line, never a traceback."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(exc.strerror or str(exc))
        self.errno = exc.errno


class _StdoutWatch:
    """``sys.stdout`` while a command runs, noting whether anything was written to it: a command
    that already printed its own JSON document (``down --json`` refused, ``setup --json`` with
    problems) keeps stdout to that one document, and its error goes to stderr as before."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.wrote = False

    def write(self, text: Any) -> Any:
        if text:
            self.wrote = True
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:  # stdout on a full disk (`> /dev/full`): not a bug in gpurun
            raise _OutputError(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _OutputError(exc) from exc

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _emit_error(code: str, message: str, hint: str | None) -> None:
    """One strict JSON document on stdout: ``{"error": {"code", "message", "hint"}}``."""
    body: dict[str, Any] = {"error": {"code": code, "message": str(message),
                                      "hint": None if hint is None else str(hint)}}
    try:
        sys.stdout.write(json.dumps(body, indent=2, allow_nan=False) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    except (_OutputError, OSError):  # stdout cannot take it (a full disk): the error still reaches stderr
        _say_error(message, hint)


def _one_line(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1b``): a newline or an
    escape sequence in a file or host name must not break the error line or forge another."""
    return text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _say_error(message: str, hint: str | None) -> None:
    """The human form of any failure: ``gpurun: error: ...`` and ``  hint: ...`` on stderr."""
    click.echo(f"gpurun: error: {_one_line(str(message))}", err=True)
    if hint:
        click.echo(f"  hint: {_one_line(str(hint))}", err=True)


def _usage_message(exc: click.ClickException, args: list[str]) -> tuple[str, str | None]:
    """A usage error as (message, hint): click's text, and the help command to run. click's
    parser raises some errors (``Option '--host' requires an argument.``) without a context:
    the command is then found from the line itself."""
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        try:
            ctx = _resolve_line(args)[1]
        except Exception:  # noqa: BLE001 - a line we cannot resolve still gets its message
            ctx = None
    hint = f"see `{ctx.command_path} --help`" if ctx is not None else "see `gpurun --help`"
    message = exc.format_message()
    if isinstance(exc, click.NoSuchOption) and len(exc.possibilities or ()) > 1:
        # click's "(Did you mean one of: '--job', '--json'?)", said the way commands are
        message = (f"No such option {exc.option_name!r}. Did you mean "
                   + " or ".join(repr(p) for p in list(exc.possibilities)[:3]) + "?")  # best match first
    return message, hint


# click >= 8.2 raises this for a group named without a subcommand; it shows the help
_NO_ARGS_IS_HELP: tuple[type, ...] = tuple(
    c for c in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if c is not None)


def _interrupted(as_json: bool) -> None:
    """Ctrl-C: say so, and what the command leaves behind (``render.on_interrupt``: jobs go on
    running on the host), then exit 130 like any program stopped by SIGINT."""
    from orchestrator.cli.render import interrupt_note  # stdlib-only module: cheap here
    note = interrupt_note()
    if as_json:
        _emit_error("interrupted", "interrupted", note)
    else:
        try:
            # a terminal shows "^C" where the cursor was: start the line afresh there only
            fresh = "\n" if sys.stderr.isatty() else ""
            click.echo(fresh + "gpurun: interrupted" + (f"; {note}" if note else ""), err=True)
        except (BrokenPipeError, OSError):
            pass
    sys.exit(CLI_CODES["interrupted"][1])


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    watch = _StdoutWatch(sys.stdout)
    # the Ctrl-C note is a module global: a note left by an earlier main() in this process
    # (tests, an embedding script) must not be printed for a command that set none. Only a
    # loaded render can hold one, and importing it here would cost `gpurun --help` ~4 ms.
    render = sys.modules.get("orchestrator.cli.render")
    if render is not None:
        render.on_interrupt(None)

    def as_json() -> bool:
        return not watch.wrote and _json_requested(args)

    sys.stdout = watch
    try:
        rv = cli.main(args=args, prog_name="gpurun", standalone_mode=False)
        watch.flush()  # here, not at exit: a full disk behind stdout is then one line too
    except GpurunError as err:
        if as_json():
            _emit_error(err.code, err.message, err.hint)
        else:
            _say_error(err.message, err.hint)
        sys.exit(err.exit_code)
    except click.exceptions.Abort as exc:
        # click turns Ctrl-C into Abort; that is an interruption, not a declined prompt
        if isinstance(exc.__cause__, KeyboardInterrupt):
            _interrupted(as_json())
        if as_json():
            _emit_error("aborted", "aborted", None)
        else:
            click.echo("gpurun: aborted", err=True)
        sys.exit(CLI_CODES["aborted"][1])
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        usage = isinstance(exc, click.UsageError)
        if isinstance(exc, _NO_ARGS_IS_HELP):  # `gpurun queue` alone: click's help is the answer
            exc.show()
            sys.exit(exc.exit_code)
        message, hint = _usage_message(exc, args) if usage else (exc.format_message(), None)
        if as_json():
            _emit_error("usage" if usage else "error", message, hint)
        else:
            _say_error(message, hint)
        sys.exit(CLI_CODES["usage"][1] if usage else exc.exit_code)
    except (KeyboardInterrupt, _Interrupted):
        _interrupted(as_json())
    except BrokenPipeError:
        sys.exit(0)
    except _OutputError as exc:
        _say_error(f"cannot write the output: {exc}", "free space where stdout goes, or send it elsewhere")
        sys.exit(1)
    except Exception as exc:  # a bug: keep the traceback (stderr), but scripts still get JSON
        if as_json():
            _emit_error("internal", f"{type(exc).__name__}: {exc}",
                        "this is a bug in gpurun; please report it with the traceback on stderr")
        raise
    else:
        sys.exit(rv if isinstance(rv, int) else 0)
    finally:
        if sys.stdout is watch:
            sys.stdout = watch._stream
