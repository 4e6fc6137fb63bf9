"""``pip install -e .`` and ``pip install .`` as a user types them (pip's default build isolation, torch
installed) install the pure-Python package, with one message saying how to build the native kernels.

Build isolation hides the installed torch from setup.py, so the native extension cannot be built there;
``pip install -e .`` used to fail ("can't copy .../_C...so: doesn't exist"). Each install runs in a scratch
virtual environment that sees this interpreter's packages (torch) through a .pth file, on a copy of the
source tree (an editable install writes into its tree). ``--no-build-isolation`` builds the kernels: that is
how .ci/run installs the project, so every other test covers it.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow
ROOT = REPO
MESSAGE = "installing the pure-Python package without its native kernels"


def _run(cmd: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECDEC_SKIP_NATIVE")}
    environ.update(env)
    return subprocess.run(cmd, cwd=cwd, env=environ, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> tuple[Path, Path]:
    """(python of a scratch venv that sees this interpreter's site-packages, a copy of the source tree)."""
    base = tmp_path_factory.mktemp("install")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base).stdout
    (Path(purelib.strip()) / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    source = base / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.so", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis", "runs",
        "results", ".cache"))
    return python, source


def _installed(python: Path, cwd: Path) -> str:
    code = textwrap.dedent("""
        import specdec_kernels, specdec_kernels.native as native
        assert not native.available()
        try:
            native.op("verify_chain", "cpu")
        except RuntimeError as exc:
            print(exc)
        print(specdec_kernels.__file__)
        print(specdec_kernels.available_backends("cpu"))
    """)
    proc = _run([str(python), "-c", code], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("editable", [True, False], ids=["editable", "regular"])
def test_pip_install_with_build_isolation_installs_the_pure_python_package(scratch, editable, tmp_path):
    python, source = scratch
    cmd = [str(python), "-m", "pip", "install", "-v", "--no-deps", *(["-e"] if editable else []), str(source)]
    proc = _run(cmd, tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert log.count(MESSAGE) == 1 and "--no-build-isolation -e ." in log
    out = _installed(python, tmp_path)
    assert "pip install --no-build-isolation -e ." in out  # the runtime message says how to build them
    assert (str(source) in out) == editable
    assert "['reference']" in out or "'reference'" in out
