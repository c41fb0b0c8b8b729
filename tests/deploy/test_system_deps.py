"""scripts/system-deps.sh: what it finds, what it would install, how it installs (fake apt)."""

import os
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "system-deps.sh"
BASH = shutil.which("bash")


def run_script(*args, env=None, user=None) -> subprocess.CompletedProcess:
    command = [BASH, str(SCRIPT), *args]
    script_text = None
    if user is not None:
        # Fed on stdin: the checkout may sit in a folder that user cannot read (a mktemp clone).
        command = [shutil.which("setpriv"), f"--reuid={user}", f"--regid={user}", "--clear-groups"]
        command += [BASH, "-s", "--", *args]
        script_text = SCRIPT.read_text()
    return subprocess.run(
        command, env=env, input=script_text, capture_output=True, text=True, timeout=60, check=False
    )


def lacking_both(tmp_path) -> dict:
    """An environment where neither chromium nor bwrap (PATH) nor an initdb (the PostgreSQL
    folder) exists."""
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    return {"PATH": str(empty), "DLSCALE_PG_LIB_DIR": str(empty)}


def test_check_passes_where_both_are_installed():
    # `make test` runs `make system-deps` first, so both are installed wherever the suite runs.
    done = run_script("--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "system packages for the tests are present" in done.stdout
    # Present means present: the default run (install mode) also exits at once, touching nothing.
    assert run_script().returncode == 0


def test_check_lists_what_it_would_install(tmp_path):
    done = run_script("--check", env=lacking_both(tmp_path))
    assert done.returncode == 1
    assert "missing: postgresql chromium bubblewrap" in done.stdout
    would = "would run: apt-get install -y --no-install-recommends postgresql chromium bubblewrap"
    assert would in done.stdout


def test_check_names_only_the_missing_package(tmp_path):
    pg = tmp_path / "pg" / "15" / "bin"
    pg.mkdir(parents=True)
    (pg / "initdb").touch()
    env = {**lacking_both(tmp_path), "DLSCALE_PG_LIB_DIR": str(tmp_path / "pg")}
    done = run_script("--check", env=env)
    assert done.returncode == 1
    assert f"postgresql: {pg / 'initdb'}" in done.stdout
    assert "missing: chromium bubblewrap" in done.stdout


def test_unknown_argument_is_refused():
    done = run_script("--instal")
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_without_root_it_prints_the_command_and_fails(tmp_path):
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.fail("setpriv (util-linux) is needed to run the script as another user")
        done = run_script(env=lacking_both(tmp_path), user=65534)
    else:
        done = run_script(env=lacking_both(tmp_path))
    assert done.returncode == 1
    assert (
        "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
        "postgresql chromium bubblewrap" in done.stderr
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the install path runs only as root")
def test_install_updates_lists_only_when_missing_and_turns_off_the_main_cluster(tmp_path):
    """A fake apt-get that knows no packages until `apt-get update` ran: the script updates once,
    installs postgresql-common before the server (so no main cluster is created), then the rest."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("tee", "grep", "sed", "mktemp", "rm"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    calls = tmp_path / "calls.txt"
    (bin_dir / "apt-get").write_text(
        f"#!{BASH}\n"
        f'echo "$*" >>{calls}\n'
        f"if [[ $1 == update ]]; then : >{tmp_path}/lists; exit 0; fi\n"
        f'[[ -e {tmp_path}/lists ]] || {{ echo "E: Unable to locate package $4"; exit 100; }}\n'
    )
    (bin_dir / "apt-get").chmod(0o755)
    conf_dir = tmp_path / "postgresql-common"
    conf_dir.mkdir()
    (conf_dir / "createcluster.conf").write_text("# comment\n#create_main_cluster = true\n")
    env = {
        "PATH": str(bin_dir),
        "DLSCALE_PG_LIB_DIR": str(tmp_path / "no-pg"),
        "DLSCALE_PG_COMMON_DIR": str(conf_dir),
    }
    done = run_script(env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls.read_text().splitlines() == [
        "install -y --no-install-recommends postgresql-common",
        "update",
        "install -y --no-install-recommends postgresql-common",
        "install -y --no-install-recommends postgresql chromium bubblewrap",
    ]
    assert (conf_dir / "createcluster.conf").read_text().splitlines() == [
        "# comment",
        "create_main_cluster = false",
    ]
    assert "installed: postgresql chromium bubblewrap" in done.stdout


def test_makefile_runs_it_before_the_tests():
    makefile = (ROOT / "Makefile").read_text()
    assert "\nsystem-deps:\n\tbash scripts/system-deps.sh\n" in makefile
    test_line = next(line for line in makefile.splitlines() if line.startswith("test:"))
    assert test_line.split(":", 1)[1].split() == ["system-deps", "lint"]
