"""Provider profiles: shipped facts, precedence, and errors that name file, line and key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from orchestrator import paths
from orchestrator.errors import ProfileError
from orchestrator.profiles import (EMBEDDED_LOCAL, EMBEDDED_SOURCE, list_profiles,
                                   load_profile, plain_words)

SHIPPED = ["autodl", "generic-ssh", "lambda", "local", "paperspace", "runpod", "slurm", "vastai"]


@pytest.fixture
def user_dir(isolated_home: Path) -> Path:
    d = paths.user_profiles_dir()
    d.mkdir(parents=True)
    return d


def write(d: Path, name: str, text: str) -> Path:
    p = d / f"{name}.yaml"
    p.write_text(text)
    return p


def error_of(name: str, **kw) -> ProfileError:
    with pytest.raises(ProfileError) as ei:
        load_profile(name, **kw)
    assert ei.value.exit_code == 2 and "\n" not in str(ei.value)
    return ei.value


# --- shipped profiles --------------------------------------------------------------------

def test_every_shipped_profile_loads_and_is_named_after_its_file(isolated_home: Path) -> None:
    profiles = {p.name: p for p in list_profiles()}
    assert sorted(profiles) == SHIPPED
    for name, p in profiles.items():
        assert p.source.endswith(f"profiles/{name}.yaml")
        assert p.data["sources"] and re.fullmatch(r"20\d\d-\d\d", p.data["checked"])
        # defaults fill what the YAML leaves out
        assert p.get("watchdog.stall_after_s") == 1200 and p.get("quality.action") == "stop"
        assert p.get("reap.min_age_s") == 120


def test_state_dir_survives_stop_and_is_never_on_a_network_fs(isolated_home: Path) -> None:
    from orchestrator.profile_schema import tier_for

    for p in list_profiles():
        tier = tier_for(p.data["paths"]["state_dir"], p.data["storage"])
        # a Slurm cluster's home is shared by design (the compute nodes write the run dirs);
        # its store is opened from one login node only (profile_schema.check_state_dir)
        assert tier["survives_stop"] and (not tier["network_fs"] or p.data["kind"] == "slurm"), p.name


def test_embedded_local_equals_the_shipped_yaml() -> None:
    text = (paths.shipped_profiles_dir() / "local.yaml").read_text()
    assert yaml.safe_load(text) == EMBEDDED_LOCAL


def test_local_works_without_the_profiles_dir(isolated_home: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "shipped_profiles_dir", lambda: tmp_path / "nowhere")
    p = load_profile("local")
    assert p.source == EMBEDDED_SOURCE and p.data["kind"] == "local"
    assert p.path("state_dir", "local") == str(paths.local_state_dir("local"))
    assert [x.name for x in list_profiles()] == ["local"]


def test_provider_facts_that_cost_money(isolated_home: Path) -> None:
    autodl = load_profile("autodl")
    assert not autodl.meter_stop_irreversible and autodl.data["destroy"]["irreversible"]
    assert "15 days" in autodl.data["danger_clocks"][0]["after"]
    assert autodl.data["detach"] == "tmux"
    assert autodl.get("network.proxy_hook") == "source /etc/network_turbo"
    assert autodl.get("network.env.HF_HUB_DISABLE_XET") == "1"
    assert autodl.get("network.env.HF_ENDPOINT") == "https://hf-mirror.com"
    fs = [t for t in autodl.data["storage"] if t["path"] == "/root/autodl-fs"][0]
    assert fs["network_fs"] and fs["survives_destroy"]

    runpod = load_profile("runpod")
    assert runpod.get("spot.grace_s") == 5 and runpod.data["destroy"]["irreversible"]
    assert runpod.get("api.credential_env") == "RUNPOD_API_KEY"
    wiped = [t["path"] for t in runpod.data["storage"] if not t["survives_stop"]]
    assert wiped == ["/"]
    assert any("2x" in b for b in runpod.data["billing"]["when_stopped"])

    vast = load_profile("vastai")
    assert vast.data["boot_hook"] == "vast_onstart" and vast.get("spot.grace_s") == 0
    assert any("forever" in b for b in vast.data["billing"]["when_stopped"])
    assert vast.get("watchdog.policy.process_gone") == "notify"  # its own override
    assert vast.get("watchdog.policy.stalled") == "notify"  # default kept beside it

    lam = load_profile("lambda")
    assert lam.meter_stop_irreversible and lam.get("ssh.user") == "ubuntu"
    assert lam.data["boot_hook"] == "systemd_user"

    words = plain_words(autodl)
    assert any("15 days" in c for c in words["danger_clocks"])
    assert "reversible" in words["meter"][0] and "IRREVERSIBLE" in words["meter"][1]


# --- precedence --------------------------------------------------------------------------

def test_user_file_overrides_deeply_and_flags_win(user_dir: Path) -> None:
    f = write(user_dir, "runpod", "watchdog:\n  stall_after_s: 2700\n  policy:\n    stalled: kill\n")
    p = load_profile("runpod")
    assert p.get("watchdog.stall_after_s") == 2700 and p.get("watchdog.policy.stalled") == "kill"
    assert p.get("watchdog.disk_pct") == 95 and p.get("spot.grace_s") == 5
    assert p.layers[-1] == str(f) and p.source.endswith("profiles/runpod.yaml")
    p = load_profile("runpod", overrides={"watchdog.stall_after_s": 300})
    assert p.get("watchdog.stall_after_s") == 300


def test_a_new_user_profile_extends_a_shipped_one(user_dir: Path) -> None:
    write(user_dir, "labbox", "extends: generic-ssh\ndescription: our lab server\n"
          "paths:\n  state_dir: /scratch/me/.gpurun\nstorage:\n"
          "  - {name: scratch, path: /scratch, survives_stop: true, survives_destroy: true,"
          " network_fs: false}\n")
    p = load_profile("labbox")
    assert p.name == "labbox" and p.get("description") == "our lab server"
    assert p.get("meter_stop.name") == "manual" and len(p.data["storage"]) == 1
    assert "labbox" in [x.name for x in list_profiles()]


def test_bad_flag_value_is_named(isolated_home: Path) -> None:
    err = error_of("local", overrides={"watchdog.disk_pct": "lots"})
    assert "command-line flag" in str(err) and "watchdog.disk_pct" in str(err)


# --- errors ------------------------------------------------------------------------------

def test_unknown_profile_lists_the_available_ones(isolated_home: Path) -> None:
    err = error_of("runpdo")
    assert "unknown profile 'runpdo'" in str(err)
    assert "did you mean 'runpod'" in err.hint and "vastai" in err.hint


def test_unknown_key_has_did_you_mean_and_line(user_dir: Path) -> None:
    f = write(user_dir, "runpod", "# mine\nwatchdog:\n  stall_afer_s: 30\n")
    err = error_of("runpod")
    assert str(err).startswith(f"{f}:3: key 'watchdog.stall_afer_s': unknown key")
    assert err.hint == "did you mean 'stall_after_s'?"


def test_wrong_type_names_file_line_key(user_dir: Path) -> None:
    f = write(user_dir, "vastai", "spot:\n  available: true\n  grace_s: soon\n")
    err = error_of("vastai")
    assert str(err).startswith(f"{f}:3: key 'spot.grace_s': expected a number")


def test_bad_enum_suggests(user_dir: Path) -> None:
    write(user_dir, "lambda", "detach: tmuxx\n")
    err = error_of("lambda")
    assert "'detach'" in str(err) and err.hint == "did you mean 'tmux'?"


def test_missing_key_in_a_new_profile(user_dir: Path) -> None:
    f = write(user_dir, "mine", "name: mine\ndescription: x\nkind: ssh\n")
    err = error_of("mine")
    assert str(err).startswith(f"{f}:1: key 'sources': missing required key")


def test_missing_nested_key_points_at_its_section(user_dir: Path) -> None:
    text = (paths.shipped_profiles_dir() / "generic-ssh.yaml").read_text()
    text = text.replace("  irreversible: true\n", "", 1).replace("name: generic-ssh", "name: g2")
    f = write(user_dir, "g2", text)
    err = error_of("g2")
    line = text.splitlines().index("meter_stop:") + 1
    assert str(err).startswith(f"{f}:{line}: key 'meter_stop.irreversible': missing")


def test_yaml_syntax_error_names_file_and_line(user_dir: Path) -> None:
    f = write(user_dir, "autodl", "watchdog:\n  stall_minutes: 3\n\tdisk_pct: 9\n")
    err = error_of("autodl")
    assert str(err).startswith(f"{f}:3: YAML syntax error")


@pytest.mark.parametrize("text,key", [
    ("api:\n  api_key: abcdef123456\n", "api.api_key"),
    ("network:\n  env:\n    HF_TOKEN: hf_xyz\n", "network.env.HF_TOKEN"),
    ("network:\n  env:\n    WANDB_API_KEY: '123'\n", "network.env.WANDB_API_KEY"),
    ("description: rpa_ABCDEFGHIJKLMNOPQRSTUV\n", "description"),
])
def test_secret_looking_values_are_refused(user_dir: Path, text: str, key: str) -> None:
    write(user_dir, "runpod", text)
    err = error_of("runpod")
    assert f"key '{key}'" in str(err) and "credential_env" in err.hint
    assert "abcdef" not in err.hint and "ABCDEFG" not in err.hint


def test_credential_env_must_be_a_name(user_dir: Path) -> None:
    write(user_dir, "runpod", "api:\n  credential_env: my key\n")
    assert "environment variable NAME" in str(error_of("runpod"))


@pytest.mark.parametrize("value", ["rpa_ABCDEFGHIJKLMNOPQRSTUV", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"])
def test_a_key_pasted_where_its_name_goes_is_never_echoed(user_dir: Path, value: str) -> None:
    """The value of a ``*_env`` key that is not a NAME is most likely the secret itself: the
    error names the key, never the value (a recognisable token is called a secret first)."""
    write(user_dir, "runpod", f"api:\n  credential_env: '{value}'\n")
    err = error_of("runpod")
    assert "key 'api.credential_env'" in str(err)
    assert value[:12] not in str(err) and value[:12] not in (err.hint or "")


def test_state_dir_on_a_network_tier_is_refused(user_dir: Path) -> None:
    f = write(user_dir, "autodl", "paths:\n  state_dir: /root/autodl-fs/state\n")
    err = error_of("autodl")
    assert str(err).startswith(f"{f}:2: key 'paths.state_dir'")
    assert "network filesystem" in str(err)


def test_state_dir_wiped_on_stop_is_refused(user_dir: Path) -> None:
    write(user_dir, "runpod", "paths:\n  state_dir: /opt/gpurun\n")
    assert "wiped on stop" in str(error_of("runpod"))


def test_name_must_match_file(user_dir: Path) -> None:
    write(user_dir, "lambda", "name: lambada\n")
    assert "differs from the file name" in str(error_of("lambda"))


def test_extends_loop_and_unknown_parent(user_dir: Path) -> None:
    write(user_dir, "a1", "extends: b1\n")
    write(user_dir, "b1", "extends: a1\n")
    assert "loops" in str(error_of("a1"))
    write(user_dir, "c1", "extends: nope\n")
    assert "unknown profile 'nope'" in str(error_of("c1"))


def test_watchdog_section_is_what_the_host_watchdog_accepts(isolated_home: Path) -> None:
    """The agent gets the profile's watchdog section verbatim; its parser must take it."""
    from orchestrator.health import watchdog
    from orchestrator.profile_schema import HOST_EVENTS, JOB_EVENTS, POLICY_ACTIONS, SCHEMA

    wd_spec = SCHEMA.fields["watchdog"]
    assert set(wd_spec.fields) == set(watchdog.DEFAULTS) | {"policy"}
    assert set(JOB_EVENTS) == set(watchdog.JOB_CODES)
    assert set(JOB_EVENTS + HOST_EVENTS) == set(watchdog.DEFAULT_POLICY)
    assert set(POLICY_ACTIONS) == set(watchdog.ACTIONS)
    for p in list_profiles():
        cfg = watchdog.settings({"watchdog": p.data["watchdog"]})
        assert cfg["stall_after_s"] == p.get("watchdog.stall_after_s"), p.name


def test_host_findings_cannot_kill(user_dir: Path) -> None:
    write(user_dir, "local", "watchdog:\n  policy:\n    disk_full: kill\n")
    err = error_of("local")
    assert "watchdog.policy.disk_full" in str(err) and "'kill' is not one of record, notify" in str(err)


# --- issue 14, bug 10: non-finite and absurd numbers; files YAML cannot read safely --------

@pytest.mark.parametrize("text,key,needle", [
    ("watchdog:\n  interval_s: .nan\n", "watchdog.interval_s", "nan is not a finite number"),
    ("watchdog:\n  stall_after_s: .inf\n", "watchdog.stall_after_s", "inf is not a finite number"),
    ("watchdog:\n  idle_util_pct: .NaN\n", "watchdog.idle_util_pct", "nan is not a finite number"),
    ("watchdog:\n  disk_pct: -.inf\n", "watchdog.disk_pct", "-inf is not a finite number"),
    ("watchdog:\n  interval_s: 1.0e+400\n", "watchdog.interval_s", "inf is not a finite number"),
    ("reap:\n  min_age_s: .nan\n", "reap.min_age_s", "nan is not a finite number"),
    ("spot:\n  grace_s: .inf\n", "spot.grace_s", "inf is not a finite number"),
    ("quality:\n  intervals_s: [600, .nan]\n", "quality.intervals_s[1]", "nan is not a finite number"),
    ("quality:\n  baseline: {loss: .inf}\n", "quality.baseline.loss", "inf is not a finite number"),
    ("watchdog:\n  interval_s: 100000000000000000000000000000\n", "watchdog.interval_s", "is too large"),
    ("autostop:\n  idle_minutes: 1.0e+300\n", "autostop.idle_minutes", "is too large"),
])
def test_non_finite_and_huge_numbers_are_refused(user_dir: Path, text: str, key: str, needle: str) -> None:
    f = write(user_dir, "runpod", text)
    err = error_of("runpod")
    assert str(err).startswith(f"{f}:2: key '{key}': ") and needle in str(err), str(err)
    assert "number" in err.hint


def test_finite_values_at_the_bounds_still_load(user_dir: Path) -> None:
    write(user_dir, "runpod", "watchdog: {interval_s: 1, idle_util_pct: 100, stall_after_s: 1000000000}\n"
          "quality: {intervals_s: [600.5, 1200]}\n")
    p = load_profile("runpod")
    assert p.get("watchdog.interval_s") == 1 and p.get("watchdog.stall_after_s") == 1_000_000_000


@pytest.mark.parametrize("content,needle", [
    (b"watchdog:\n  interval_s: 60\n  note: caf\xe9\n", ":3: not valid UTF-8 (byte 0xe9)"),
    (b"watchdog: " + b"[" * 100_000 + b"\n", "nested deeper than 64 levels"),        # libyaml: SIGSEGV
    (b"watchdog: {interval_s: 1" + b"0" * 5000 + b"}\n", "cannot read a value"),      # int() refuses it
    (b"checked: 2026-02-30\n", "cannot read a value"),                                 # not a date
    (b"a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
        b"a%d: &a%d [%s]\n" % (i, i, b", ".join([b"*a%d" % (i - 1)] * 10)) for i in range(1, 9)),
     "more than 100000 keys and items"),                                                # a billion laughs
])
def test_files_yaml_cannot_read_safely_are_one_error(user_dir: Path, content: bytes, needle: str) -> None:
    import time

    (user_dir / "runpod.yaml").write_bytes(content)
    t0 = time.perf_counter()
    err = error_of("runpod")
    assert needle in str(err) and str(err).startswith(str(user_dir / "runpod.yaml"))
    assert time.perf_counter() - t0 < 5


def test_a_profile_that_is_a_fifo_is_refused(user_dir: Path) -> None:
    import os

    os.mkfifo(user_dir / "runpod.yaml")
    assert "is not a regular file" in str(error_of("runpod"))


def test_a_dangling_link_or_folder_named_yaml_is_one_error(user_dir: Path) -> None:
    (user_dir / "runpod.yaml").symlink_to(user_dir / "nowhere.yaml")
    assert "cannot read the profile (a broken link or a directory)" in str(error_of("runpod"))
    (user_dir / "runpod.yaml").unlink()
    (user_dir / "runpod.yaml").mkdir()
    assert "cannot read the profile" in str(error_of("runpod"))
