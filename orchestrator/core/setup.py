"""``gpurun setup``: probe a fresh box in one round trip, judge it, prepare it.

``run_setup`` probes (``templates/setup_probe.sh``), turns the raw facts into checks
(``core/setup_checks.py``), then creates the dir layout, writes ``<state_dir>/env.sh`` and
installs the profile's boot hook. ``dry_run`` returns the same plan with nothing run.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator import paths
from orchestrator.errors import AgentError, ProfileError
from orchestrator.profiles import Profile, plain_words
from orchestrator.transport.framing import unframe
from orchestrator.transport.base import rpath as rq

VAST_ONSTART = "/root/onstart.sh"
PROBE_TIMEOUT = 60.0


@dataclass
class Action:
    """One command setup runs on the host; ``input`` goes to its stdin."""

    what: str
    command: str
    input: str | None = None
    done: bool | None = None
    error: str | None = None


def layout(profile: Profile, host: dict) -> dict[str, str]:
    """Where things go on the host: the host entry's dirs win over the profile's."""
    name = host["name"]
    cache = profile.path("cache_dir", name).rstrip("/") or "/"
    return {
        "state_dir": host.get("state_dir") or profile.path("state_dir", name),
        "workdir": host.get("workdir") or profile.path("workdir", name),
        "cache_dir": cache,
        "hf_home": f"{cache}/huggingface",
        "pip_cache": f"{cache}/pip",
        "durable_dir": profile.path("durable_dir", name),
    }


def probe_paths(profile: Profile, lay: dict) -> list[str]:
    """Every path the probe measures: the profile's tiers, then the layout's dirs."""
    out = [t["path"] for t in profile.data["storage"]]
    for key in ("state_dir", "workdir", "cache_dir", "durable_dir"):
        if lay.get(key) and lay[key] not in out:
            out.append(lay[key])
    return out


def probe_action(profile: Profile, lay: dict) -> Action:
    script = (paths.templates_dir() / "setup_probe.sh").read_text()
    args = " ".join(shlex.quote(p) for p in probe_paths(profile, lay))
    return Action("probe the box (read-only)", f"sh -s -- {args}", input=script)


def run_probe(transport: Any, profile: Profile, lay: dict) -> dict:
    """One round trip; raises AgentError when the box gives no readable reply."""
    act = probe_action(profile, lay)
    res = transport.run(act.command, input=act.input, timeout=PROBE_TIMEOUT)
    try:
        return unframe(res.stdout)
    except ValueError:
        tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])[:300]
        raise AgentError(f"the setup probe gave no reply (exit {res.exit_code}): {tail}",
                         "is /bin/sh usable on the host? try `ssh HOST sh -c true`") from None


# --- files rendered for the host --------------------------------------------------------

def _fill(template: str, values: dict[str, str]) -> str:
    text = (paths.templates_dir() / template).read_text()
    for key, val in values.items():
        text = text.replace(f"@@{key}@@", val)
    return text


def proxy_line(hook: str | None) -> str:
    """The profile's proxy hook, made safe for POSIX sh: dash has no ``source``, and a
    failing ``.`` of a missing file would abort the job's shell."""
    if not hook:
        return "# no proxy hook in this profile"
    words = hook.split()
    if len(words) == 2 and words[0] in ("source", "."):
        f = words[1]
        return f"if [ -r {rq(f)} ]; then . {rq(f)} >/dev/null 2>&1; fi"
    return f"{{ {hook} ; }} >/dev/null 2>&1 || true"


def render_env(profile: Profile, host: dict, lay: dict) -> str:
    env = profile.data["network"].get("env") or {}
    lines = [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())]
    return _fill("job_env.sh", {
        "HOST": host["name"], "PROFILE": profile.name,
        "HF_HOME": rq(lay["hf_home"]), "PIP_CACHE": rq(lay["pip_cache"]),
        "PROXY": proxy_line(profile.data["network"].get("proxy_hook")),
        "ENV": "\n".join(lines) or "# no mirror settings in this profile",
    })


def render_boot(profile: Profile, host: dict, lay: dict, python: str) -> str:
    return _fill("boot_ensure.sh", {
        "HOST": host["name"], "STATE": rq(lay["state_dir"]), "PYTHON": shlex.quote(python),
        "DETACH": shlex.quote(profile.data["detach"]),
    })


def render_unit(host: dict, boot_path: str) -> str:
    # systemd expands %h to the user's home; it knows nothing of ``~``.
    path = "%h/" + boot_path[2:] if boot_path.startswith("~/") else boot_path
    return _fill("gpurun-agent.service", {"HOST": host["name"], "BOOT": path})


def _write(path: str, what: str, text: str, mode: str = "644") -> Action:
    """Atomic write of ``text`` (from stdin) to ``path`` on the host."""
    tmp = rq(path + ".gpurun-tmp")
    return Action(what, f"cat > {tmp} && chmod {mode} {tmp} && mv -f {tmp} {rq(path)}",
                  input=text)


# --- the plan ----------------------------------------------------------------------------

def boot_hook_actions(profile: Profile, host: dict, lay: dict, probe: dict | None,
                      python: str, onstart: str = VAST_ONSTART) -> tuple[list[Action], list[str]]:
    """Actions installing the profile's boot hook, and notes on what was chosen and why."""
    hook = profile.data["boot_hook"]
    notes: list[str] = []
    if hook == "none":
        return [], ["No boot hook for this profile; the next gpurun call re-starts the agent."]
    tools = (probe or {}).get("tools", {})
    if hook == "systemd_user" and probe is not None and not probe.get("systemd_user"):
        notes.append("`systemctl --user` does not work here; using a cron @reboot line instead.")
        hook = "cron_reboot"
    if hook == "cron_reboot" and probe is not None and not tools.get("crontab"):
        return [], notes + ["No crontab on this box: no boot hook installed; after a reboot "
                            "the next gpurun call re-starts the agent."]
    boot = lay["state_dir"].rstrip("/") + "/boot.sh"
    acts = [_write(boot, "write the boot script (re-ensures the agent)",
                   render_boot(profile, host, lay, python), mode="755")]
    tag = f"gpurun-boot:{host['name']}"
    if hook == "cron_reboot":
        line = f"@reboot /bin/sh {rq(boot)} # {tag}".replace("%", "\\%")
        acts.append(Action("add a cron @reboot line", (
            't=$(mktemp) && { crontab -l 2>/dev/null | grep -v -F '
            f"{shlex.quote('# ' + tag)}; echo {shlex.quote(line)}; }} > \"$t\" && "
            'crontab "$t"; rc=$?; rm -f "$t"; exit $rc')))
    elif hook == "vast_onstart":
        begin, end = f"# >>> {tag} >>>", f"# <<< {tag} <<<"
        f, t = rq(onstart), rq(onstart + ".gpurun-tmp")
        acts.append(Action(f"add the agent to vast's {onstart} (re-runs on every start)", (
            f"touch {f} && awk -v b={shlex.quote(begin)} -v e={shlex.quote(end)} "
            "'$0==b{s=1} !s{print} $0==e{s=0}' " f"{f} > {t} && "
            f"printf '%s\\n' {shlex.quote(begin)} {shlex.quote(f'/bin/sh {rq(boot)} &')} "
            f"{shlex.quote(end)} >> {t} && chmod 755 {t} && mv -f {t} {f}")))
    elif hook == "systemd_user":
        unit = f"gpurun-agent-{host['name']}.service"
        acts.append(_write(f"~/.config/systemd/user/{unit}", "write the systemd user unit",
                           render_unit(host, boot)))
        acts.append(Action("enable the unit (and linger, so it starts without a login)",
                           f"systemctl --user daemon-reload && systemctl --user enable "
                           f"{shlex.quote(unit)} && {{ loginctl enable-linger \"$(id -un)\" "
                           f"2>/dev/null || echo 'linger not enabled: unit starts at first "
                           f"login' >&2; }}"))
    notes.append(f"Boot hook: {hook}.")
    return acts, notes


def plan(profile: Profile, host: dict, lay: dict, probe: dict | None,
         onstart: str = VAST_ONSTART) -> tuple[list[Action], list[str]]:
    python = ((probe or {}).get("python") or {}).get("path") or host.get("python") or "python3"
    dirs = [lay["state_dir"], lay["state_dir"].rstrip("/") + "/bin", lay["workdir"],
            lay["hf_home"], lay["pip_cache"]]
    acts = [Action("create the directory layout",
                   "mkdir -p " + " ".join(rq(d) for d in dirs)),
            _write(lay["state_dir"].rstrip("/") + "/env.sh", "write the job environment",
                   render_env(profile, host, lay))]
    hook_acts, notes = boot_hook_actions(profile, host, lay, probe, python, onstart)
    return acts + hook_acts, notes


def run_setup(profile: Profile, host: dict, transport: Any, *, dry_run: bool = False,
              onstart: str = VAST_ONSTART) -> dict:
    """Probe, judge, prepare. Returns the report (JSON contract, see cli/setup.py). Nothing
    is changed on the host when ``dry_run`` or when a check refuses (``report['refusal']``)."""
    from orchestrator.core.setup_checks import analyse

    lay = layout(profile, host)
    report: dict[str, Any] = {
        "host": host["name"], "profile": profile.name, "dry_run": dry_run, "layout": lay,
        "checks": [], "gpus": [], "driver": None, "cuda": None, "tiers": [], "actions": [],
        "notes": [], "refusal": None, "plain": plain_words(profile), "ok": True,
    }
    if host.get("profile") and host["profile"] != profile.name:
        report["notes"].append(f"Host {host['name']!r} is registered with profile "
                               f"{host['profile']!r}; this setup used {profile.name!r}.")
    probe = None
    if dry_run:
        report["actions"].append(asdict(probe_action(profile, lay)) | {"input": "<probe script>"})
    else:
        probe = run_probe(transport, profile, lay)
        report.update(analyse(probe, profile, host, lay))
    acts, notes = plan(profile, host, lay, probe, onstart)
    report["notes"] += notes
    if report["refusal"] is None and not dry_run:
        for act in acts:
            res = transport.run(act.command, input=act.input, timeout=PROBE_TIMEOUT)
            act.done = res.exit_code == 0
            if not act.done:
                act.error = (res.stderr or res.stdout).strip()[-300:] or f"exit {res.exit_code}"
                report["ok"] = False
                break
    report["actions"] += [asdict(a) for a in acts]
    if any(c["status"] == "fail" for c in report["checks"]) or report["refusal"]:
        report["ok"] = False
    return report


def setup_host(provider: str, host: str, *, dry_run: bool = False) -> dict:
    """``gpurun setup PROVIDER HOST``: :func:`run_setup` with profile ``provider`` on inventory
    host ``host``. A dry run opens no connection at all. Returns the report; raises
    ProfileError / HostError for bad names, TransportError when the box cannot be reached."""
    from orchestrator.core.session import open_session
    from orchestrator.hosts import get_host
    from orchestrator.profiles import load_profile

    profile = load_profile(provider)
    entry = get_host(host)
    if dry_run:
        return run_setup(profile, entry, None, dry_run=True)
    with open_session(host=entry) as session:
        return run_setup(profile, entry, session.transport)


def refusal_error(report: dict) -> ProfileError:
    r = report["refusal"]
    return ProfileError(r["message"], r["hint"])
