"""A newcomer's first queue on a fresh SSH box, through the real CLI: no `setup`, no `push`.

The agent is sent on first use, so a self-contained job just runs; a job that needs the
project's files fails, and the submit must have said why beforehand (nothing pushed yet, and
the `push` / `queue retry` to run), and `--wait` must say where the failed job's output is.
After a push the warning is gone and the retried job succeeds. And `pull`'s progress bars on
an 80-column terminal stay one line each, figures and the file's own name included.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from rigs.agents import gpurun, kill_agents_under, one_error
from rigs.sshd import CLEAN_USER


def test_fresh_box_without_push_says_what_to_do(sshd, home: Path, tmp_path: Path) -> None:
    box = sshd.user_dir(CLEAN_USER, "newuser")     # a fresh state dir and workdir on the box
    res = gpurun("host", "add", "box", "--ssh", f"{CLEAN_USER}@127.0.0.1:{sshd.port}",
                 "--key", str(sshd.client_key), "--state-dir", str(box / "state"),
                 "--workdir", str(box / "work"))
    assert res.returncode == 0, res.stderr
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('trained')\n")
    q = proj / "q.txt"
    q.write_text('[name=hello] echo hi\n[name="my run"] python3 train.py\n')
    try:
        res = gpurun("queue", "submit", str(q), "--host", "box", "--wait", cwd=str(proj))
        assert res.returncode == 1, (res.stdout, res.stderr)
        assert "Traceback" not in res.stderr
        warn = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: nothing was pushed")]
        assert len(warn) == 1, res.stderr
        assert f"{box / 'work'}" in warn[0] and "`gpurun push --host box .`" in warn[0], warn
        assert "`gpurun queue retry NAME --host box`" in warn[0], warn
        assert "see why with `gpurun queue logs 'my run' --host box`" in res.stderr, res.stderr
        states = {ln.split()[1]: ln.split()[2] for ln in res.stdout.splitlines()[1:]}
        assert states.get("hello") == "succeeded", res.stdout   # the agent went up by itself

        # a job that is not there: the error names the box and the status command for it
        res = gpurun("queue", "logs", "nosuch", "--host", "box")
        assert "no job 'nosuch' on box" in one_error(res), res.stderr
        assert "`gpurun queue status --host box`" in res.stderr, res.stderr

        # submitting the same file again adds nothing, and says nothing more about pushing
        res = gpurun("queue", "submit", str(q), "--host", "box", cwd=str(proj))
        assert res.returncode == 0 and "nothing was pushed" not in res.stderr, res.stderr

        # what the warning said to do works: push, retry, and the job succeeds
        assert gpurun("push", "--host", "box", str(proj)).returncode == 0
        res = gpurun("queue", "retry", "my run", "--host", "box")
        assert res.returncode == 0, res.stderr
        res = gpurun("queue", "submit", str(q), "--host", "box", "--wait", cwd=str(proj))
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert "nothing was pushed" not in res.stderr and "did not succeed" not in res.stderr
    finally:
        kill_agents_under(box)


def _on_terminal(*args: str, columns: int = 80) -> tuple[int, str]:
    """The real CLI with stderr on a pseudo-terminal ``columns`` wide: (exit code, stderr)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=slave, env=dict(os.environ, COLUMNS=str(columns)))
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:          # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


def test_pull_bars_fit_80_columns_with_a_long_checkpoint_path(home: Path, tmp_path: Path) -> None:
    q = tmp_path / "q.txt"
    name = "model_epoch_0012_step_000120000.pt"
    q.write_text(f"[name=ckpt checkpoints=out] mkdir -p out/a-rather-long-directory-name && "
                 f"head -c 150000000 /dev/zero > out/a-rather-long-directory-name/{name}\n")
    assert gpurun("queue", "submit", str(q), "--wait", cwd=str(tmp_path)).returncode == 0
    code, err = _on_terminal("pull")
    assert code == 0, err
    frames = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", err).replace("\r", "\n").splitlines()
    bars = [ln for ln in frames if "/150.0 MB" in ln]
    assert bars, err                                   # the checkpoint's bar was drawn
    # one line each, at most 80 wide, with the bar, the figures and the file's own name
    assert all(len(ln) <= 80 and name[-16:] in ln and "━" in ln for ln in bars), bars
    assert "verified" in err, err


def test_ctrl_c_inside_paramiko_leaves_promptly(ssh_host: dict, monkeypatch) -> None:
    """Ctrl-C can strike inside paramiko while a channel's buffer lock is held (a `queue submit
    --wait` once hung there for good, in the channel's close). Here the interrupt comes from
    exactly there, over the real sshd: the command must end with KeyboardInterrupt at once."""
    import threading

    from orchestrator.transport import ssh as ssh_mod

    def interrupted_pump(chan, stdin, timeout, name):
        chan.in_buffer._lock.acquire()       # what an interrupt between acquire and release leaves
        raise KeyboardInterrupt

    monkeypatch.setattr(ssh_mod, "pump", interrupted_pump)
    got: list[BaseException] = []

    def call() -> None:                      # the command, then the connection's close
        try:
            with ssh_mod.SSHTransport(ssh_host) as t:
                t.run("sleep 5")
        except BaseException as exc:         # noqa: B036 (the point is which one)
            got.append(exc)
    th = threading.Thread(target=call, daemon=True)
    th.start()
    th.join(10)
    assert not th.is_alive(), "hung after the interrupt (closing a channel whose buffer lock is held)"
    assert got and isinstance(got[0], KeyboardInterrupt), got
