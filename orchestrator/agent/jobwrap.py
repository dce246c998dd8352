"""The per-job wrapper: runs one attempt of a job and records its exit code durably.

The daemon starts this as a session leader (its own process group) with the job's marker in
its environment. It survives the daemon's death, so a job re-adopted after an agent crash
still gets its exit code written (``exit.<attempt>``, via temp file + rename).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def _shell() -> str:
    return "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"


def write_exit(path: str, code: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % code)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run(started_file: str, exit_file: str, log_file: str, cwd: str, command: str) -> int:
    # A Python handler (not SIG_IGN) so the child gets default dispositions after exec,
    # while the wrapper lives on to record the exit code when the group is TERMed.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    with open(started_file, "w") as f:
        f.write("%d\n" % os.getpid())
    env_file = os.environ.get("GPURUN_ENV_FILE", "")
    script = command
    if env_file and os.path.exists(env_file):
        script = '. "$GPURUN_ENV_FILE"\n' + command
    with open(log_file, "ab", buffering=0) as log:
        log.write(("--- gpurun: attempt %s started %s in %s\n" % (
            os.environ.get("GPURUN_ATTEMPT", "?"), time.strftime("%Y-%m-%dT%H:%M:%S%z"), cwd)).encode())
        try:
            proc = subprocess.Popen([_shell(), "-c", script], cwd=cwd or None, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, close_fds=True)
        except OSError as exc:
            log.write(("--- gpurun: could not start: %s\n" % exc).encode())
            write_exit(exit_file, 127)
            return 127
        while True:
            try:
                code = proc.wait()
                break
            except InterruptedError:
                continue
        log.write(("--- gpurun: exit code %d at %s\n" % (code, time.strftime("%Y-%m-%dT%H:%M:%S%z"))).encode())
    write_exit(exit_file, code)
    return code


def main(argv: list) -> int:
    started_file, exit_file, log_file, cwd, command = argv[:5]
    run(started_file, exit_file, log_file, cwd, command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
