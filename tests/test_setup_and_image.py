"""`make setup`'s choice of Python 3.10 (scripts/find_python310.sh) on machines with and without one, and the image:
hadolint finds nothing, and it installs the very lock file `make setup` installs."""
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from components.distributed.tfjob import IMAGE_USER_ID

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "find_python310.sh"
BASH = shutil.which("bash")
# The stand-ins run with PATH holding only the test's bin folder, so they call the tools they need by full path.
MKDIR, CHMOD, CP, DIRNAME, CAT = (shutil.which(tool) for tool in ("mkdir", "chmod", "cp", "dirname", "cat"))


def executable(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{BASH}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def interpreter(path: Path, minor: int = 10) -> Path:
    """A stand-in `python` that answers the version check as Python 3.<minor> does."""
    return executable(path, f"exit {0 if minor == 10 else 1}")


def fake_uv(path: Path, log: Path, managed: Path, installed: bool) -> Path:
    """A stand-in `uv` that finds `managed` once it is installed and installs it on `uv python install 3.10`."""
    if installed:
        interpreter(managed)
    return executable(path, f"""echo "uv $*" >> {log}
if [ "$1 $2" = "python find" ] && [ -x {managed} ]; then echo {managed}; exit 0; fi
if [ "$1 $2" = "python find" ]; then exit 2; fi
if [ "$1 $2 $3" = "python install 3.10" ]; then {MKDIR} -p {managed.parent}; printf '#!{BASH}\\nexit 0\\n' > {managed}
  {CHMOD} +x {managed}; exit 0; fi
exit 3""")


def choose(tmp_path: Path) -> subprocess.CompletedProcess:
    env = {"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path / "home"), "UV_VERSION": "0.13.9",
           "UV_BOOTSTRAP_DIR": str(tmp_path / "bootstrap")}
    return subprocess.run([BASH, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def test_python310_on_path_is_chosen_first(tmp_path):
    python = interpreter(tmp_path / "bin" / "python3.10")
    interpreter(tmp_path / "home" / ".pyenv" / "versions" / "3.10.13" / "bin" / "python")
    result = choose(tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, str(python))


def test_pyenv_serves_when_path_has_no_python310(tmp_path):
    interpreter(tmp_path / "bin" / "python3.10", minor=11)  # a python3.10 name that is not 3.10 does not count
    python = interpreter(tmp_path / "home" / ".pyenv" / "versions" / "3.10.13" / "bin" / "python")
    fake_uv(tmp_path / "bin" / "uv", tmp_path / "uv.log", tmp_path / "managed" / "python3.10", installed=True)
    result = choose(tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, str(python))
    assert not (tmp_path / "uv.log").exists(), "uv is not asked while pyenv has 3.10"


@pytest.mark.parametrize("installed", [True, False])
def test_uv_managed_python_when_none_is_installed(tmp_path, installed):
    managed = tmp_path / "uv-python" / "cpython-3.10" / "bin" / "python3.10"
    fake_uv(tmp_path / "bin" / "uv", tmp_path / "uv.log", managed, installed=installed)
    result = choose(tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, str(managed)), result.stderr
    calls = (tmp_path / "uv.log").read_text().splitlines()
    assert calls == (["uv python find 3.10"] if installed else
                     ["uv python find 3.10", "uv python install 3.10", "uv python find 3.10"])


def test_uv_is_bootstrapped_from_pypi_with_any_python3(tmp_path):
    """No uv on PATH: the pinned uv goes into a bootstrap venv made by python3, then it fetches 3.10."""
    managed = tmp_path / "uv-python" / "bin" / "python3.10"
    log = tmp_path / "uv.log"
    # python3 -m venv DIR makes DIR/bin/pip, whose `install uv==...` puts the stand-in uv there.
    uv_body = fake_uv(tmp_path / "uv-template", log, managed, installed=False).read_text()
    executable(tmp_path / "bin" / "python3", f"""[ "$1 $2" = "-m venv" ] || exit 1
{MKDIR} -p "$3/bin"
{CAT} > "$3/bin/pip" <<'PIP'
#!{BASH}
echo "pip $*" >> {log}
{CP} {tmp_path / "uv-template"} "$({DIRNAME} "$0")/uv"
PIP
{CHMOD} +x "$3/bin/pip"
""")
    assert "python install" in uv_body
    result = choose(tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, str(managed)), result.stderr
    assert log.read_text().splitlines()[0] == "pip install -q uv==0.13.9"
    assert "uv python install 3.10" in log.read_text()


def test_no_way_to_python310_says_what_to_install(tmp_path):
    (tmp_path / "bin").mkdir()
    result = choose(tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert "install Python 3.10 (for example 'uv python install 3.10' or 'pyenv install 3.10')" in result.stderr


def test_hadolint_finds_nothing_in_the_dockerfile():
    hadolint = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv"), "bin", "hadolint")
    hadolint = hadolint if hadolint.exists() else Path(shutil.which("hadolint") or "hadolint")
    result = subprocess.run([str(hadolint), "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr


def dockerfile_stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), split into stages."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def test_the_image_installs_the_lock_file_make_setup_installs():
    makefile = (ROOT / "Makefile").read_text()
    uv_version = re.search(r"^UV_VERSION := (\S+)$", makefile, re.M).group(1)
    setup_sync = re.search(r"\$\(UV\) pip sync (.*)$", makefile, re.M).group(1)
    assert setup_sync.split()[-1] == "requirements.lock"
    stages = dockerfile_stages()
    everything = [line for stage in stages for line in stage]
    # One version list: the lock, synced (not installed on top of something else) with the Makefile's uv.
    assert f"ARG UV_VERSION={uv_version}" in everything
    syncs = [line for line in everything if " pip sync " in line]
    assert len(syncs) == 1 and syncs[0].endswith("/tmp/requirements.lock")
    assert "COPY requirements.lock /tmp/requirements.lock" in everything
    installs = [line for line in everything if re.search(r"pip install|npm install", line)]
    assert installs == ['RUN pip install --no-cache-dir "uv==${UV_VERSION}" && python -m venv /opt/venv']
    # apt brings only a pinned compiler for the lock's source-only packages, and only to the stage that syncs it.
    apt_installs = [line for line in everything if "apt-get install" in line]
    assert apt_installs and all(line in stages[1] for line in apt_installs)
    assert all(re.search(r"apt-get install -y --no-install-recommends g\+\+=\S+ &&", line) for line in apt_installs)
    # The same Python minor as `make setup` and `make lock`.
    assert re.search(r"--python-version 3\.10\b", makefile)
    assert all(line.split()[1].startswith("python:3.10-") for line in everything
               if line.startswith("FROM python"))
    # The same npm lock as `make setup`.
    assert any("npm ci" in line for line in stages[0]) and "npm ci" in makefile


def test_the_final_stage_is_lean_non_root_and_selects_keras_2():
    final = dockerfile_stages()[-1]
    assert not any(re.search(r"\b(npm|apt-get|pip|uv|gcc|make)\b", line) for line in final if line.startswith("RUN"))
    user = [line for line in final if line.startswith("USER ")]
    assert user and user[-1] == f"USER {IMAGE_USER_ID}" and IMAGE_USER_ID != 0, "the TFJob pods run as this user"
    env = " ".join(line for line in final if line.startswith("ENV "))
    assert "TF_USE_LEGACY_KERAS=1" in env
    # Dependencies before code: every COPY of the venv or node_modules comes before the code.
    copies = [line for line in final if line.startswith("COPY")]
    first_code = next(i for i, line in enumerate(copies) if "--from" not in line)
    assert all("--from" not in line for line in copies[first_code:])
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and "**/node_modules" in ignored
