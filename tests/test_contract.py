"""The README's two commands need no root: ``make test`` as a user without sudo, on a machine without the
optional tools, must not stop before pytest (the tools target says which tests will be skipped instead)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _tools(tmp_path: Path, uid: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``make tools`` with ``id -u`` answering ``uid``, a sudo that asks for a password, and an apt-get
    that records its calls; promtool, stunnel and openssl are not on the PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-calls"
    _stub(bin_dir, "id", f'[ "$1" = -u ] && echo {uid} || /usr/bin/id "$@"')
    _stub(bin_dir, "sudo", "echo 'sudo: a password is required' >&2; exit 1")
    _stub(bin_dir, "apt-get", f'echo "$@" >> {calls}; exit 0')
    for tool in ("make", "sh", "bash", "env", "cat", "test", "["):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/tmp")}
    run = subprocess.run(["make", "-s", "-C", str(ROOT), "tools"], env=env, capture_output=True, text=True, timeout=60)
    return run, calls


def test_tools_without_root_or_sudo_skip_instead_of_failing(tmp_path):
    run, calls = _tools(tmp_path, uid="1000")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "will be skipped" in run.stdout and "prometheus" in run.stdout
    assert not calls.exists(), "apt-get must not run without root"


def test_tools_as_root_install_them(tmp_path):
    run, calls = _tools(tmp_path, uid="0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "install" in calls.read_text() and "prometheus" in calls.read_text()
