"""The test suites' fork server (`pipekit_train.core.testing.spawn_python` / `run_python`).

A forked worker must look to a test exactly like `subprocess.run([sys.executable, ...])`:
its output, exit status (`-9` after SIGKILL), environment, working directory and
`sys.argv`, atexit handlers and non-daemon threads; and the server must refuse to fork from
a process whose imports started a thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipekit_train.core.testing import ForkedProcess, run_python, spawn_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork server: Linux")

SCRIPT = """
import atexit, json, os, sys, threading, time
import helper_mod
atexit.register(lambda: print("atexit ran", flush=True))
def late():
    time.sleep(0.2)
    print("thread joined", flush=True)
threading.Thread(target=late).start()
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "flag": os.environ.get("FS_FLAG"),
                  "preloaded": helper_mod.LOADED_BY, "pid": os.getpid(), "path0": sys.path[0]}))
print("to stderr", file=sys.stderr)
mode = sys.argv[1]
if mode == "kill":
    os.kill(os.getpid(), 9)
if mode == "exit":
    sys.exit(3)
if mode == "raise":
    raise ValueError("boom")
if mode == "wait":
    open(os.environ["FS_READY"], "w").close()
    time.sleep(60)
"""


@pytest.fixture(autouse=True)
def _fork_server_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the fork server itself: on, whatever the caller's environment says."""
    monkeypatch.delenv("PIPEKIT_TEST_FORK_SERVER", raising=False)


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "worker.py").write_text(SCRIPT)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper_mod.py").write_text("import os\nLOADED_BY = os.getpid()\n")
    (lib / "threaded_mod.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
    )
    return tmp_path


def _env(workdir: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(workdir / "lib"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def test_a_forked_worker_runs_like_a_fresh_interpreter(workdir: Path) -> None:
    import json

    env = _env(workdir, FS_FLAG="one")
    plain = subprocess.run(
        [sys.executable, str(workdir / "worker.py"), "ok"], env=env, capture_output=True, text=True
    )
    forked = run_python([str(workdir / "worker.py"), "ok"], env=env, preload=("helper_mod",))
    assert forked.returncode == plain.returncode == 0
    info, plain_info = (
        json.loads(forked.stdout.splitlines()[0]),
        json.loads(plain.stdout.splitlines()[0]),
    )
    # helper_mod was imported by the server, before the fork: not by the worker
    assert info["preloaded"] != info["pid"] and plain_info["preloaded"] == plain_info["pid"]
    for key in ("argv", "cwd", "flag", "path0"):
        assert info[key] == plain_info[key], key
    # the interpreter's shutdown: non-daemon threads joined, then atexit handlers
    assert forked.stdout.splitlines()[1:] == ["thread joined", "atexit ran"]
    assert forked.stderr == plain.stderr == "to stderr\n"
    # the environment is the caller's, per worker, from one server
    again = run_python(
        [str(workdir / "worker.py"), "ok"],
        env=_env(workdir, FS_FLAG="two"),
        preload=("helper_mod",),
    )
    assert json.loads(again.stdout.splitlines()[0])["flag"] == "two"
    elsewhere = run_python(
        [str(workdir / "worker.py"), "ok"], env=env, preload=("helper_mod",), cwd=workdir / "lib"
    )
    assert json.loads(elsewhere.stdout.splitlines()[0])["cwd"] == str(workdir / "lib")


@pytest.mark.parametrize(("mode", "status"), [("kill", -9), ("exit", 3), ("raise", 1)])
def test_exit_status_matches_a_subprocess(workdir: Path, mode: str, status: int) -> None:
    env = _env(workdir)
    plain = subprocess.run(
        [sys.executable, str(workdir / "worker.py"), mode], env=env, capture_output=True
    )
    forked = run_python([str(workdir / "worker.py"), mode], env=env, preload=("helper_mod",))
    assert forked.returncode == plain.returncode == status
    if mode == "raise":
        assert "ValueError: boom" in forked.stderr


def test_signals_reach_the_forked_worker_by_its_pid(workdir: Path) -> None:
    import time

    ready = workdir / "ready"
    env = _env(workdir, FS_READY=str(ready))
    proc = spawn_python([str(workdir / "worker.py"), "wait"], env=env, preload=("helper_mod",))
    assert isinstance(proc, ForkedProcess)
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    out, _ = proc.communicate()
    assert '"argv": ["wait"]' in out


def test_a_module_runs_with_dash_m(workdir: Path) -> None:
    proc = run_python(["-m", "platform"], env=_env(workdir), preload=("helper_mod",))
    assert (
        proc.returncode == 0
        and proc.stdout.strip()
        == subprocess.check_output([sys.executable, "-m", "platform"], text=True).strip()
    )


def test_no_fork_after_imports_that_start_a_thread(workdir: Path) -> None:
    proc = spawn_python(
        [str(workdir / "worker.py"), "ok"], env=_env(workdir), preload=("threaded_mod",)
    )
    assert isinstance(proc, subprocess.Popen)  # a plain interpreter instead
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and '"argv": ["ok"]' in out


def test_switched_off_or_without_preload_it_is_a_plain_subprocess(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = spawn_python(["-m", "platform"], env=_env(workdir))
    assert isinstance(proc, subprocess.Popen)
    proc.communicate(timeout=60)
    monkeypatch.setenv("PIPEKIT_TEST_FORK_SERVER", "0")
    proc = spawn_python(["-m", "platform"], env=_env(workdir), preload=("helper_mod",))
    assert isinstance(proc, subprocess.Popen)
    proc.communicate(timeout=60)


def test_bad_arguments_are_refused(workdir: Path) -> None:
    with pytest.raises(ValueError, match=r"Received: args=\['-c', 'print\(1\)'\]"):
        spawn_python(["-c", "print(1)"], env=_env(workdir), preload=("helper_mod",))
    with pytest.raises(ValueError, match=r"Received: args=\[\]"):
        spawn_python([], env=_env(workdir))
