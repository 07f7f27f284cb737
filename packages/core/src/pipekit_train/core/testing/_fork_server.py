"""A fork server for the test suites' worker subprocesses (`python [-m module | script] args`).

A kill-and-resume or preemption test starts a fresh Python process that imports its
framework before it trains one tiny model: `import lightning` alone costs ~6 s of CPU,
torch ~2 s, and a suite starts dozens of such workers. `spawn_python` / `run_python` start
them from a server process instead, which imported those modules once (`preload`) and
forks a child per worker. The child is what a fresh `python args...` would be, as far as the
test sees: its own pid (signals and `SIGKILL` reach it; a lease records it), the same
environment, its output in the test's hands, the interpreter's usual exit (atexit
handlers, non-daemon threads joined) and exit status (`-9` after `SIGKILL`).

Forking is safe only from a process with one thread and no initialized accelerator
runtime: the server refuses to fork after its imports started another thread (jax's
backend, an OpenMP team; jemalloc's background thread, which has fork handlers, excepted) and the caller falls back to a plain subprocess, as it does
without `preload`, off Linux, or with `PIPEKIT_TEST_FORK_SERVER=0`.

The server reads one JSON request per line on stdin, answers `{"pid": ...}` on its own
channel, reports `{"exit": pid, "returncode": ...}` when a child ends, and exits when
its stdin closes (the test process ended).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ForkedProcess", "run_python", "spawn_python"]

_SERVERS: dict[tuple[Any, ...], _Server] = {}
_LOCK = threading.Lock()
_MAX_SERVERS = 3
# `-c`, not `-m`: the server module is part of the package that `preload` usually imports
_SERVER_MAIN = f"from {__name__} import main; main()"
# Variables that change in the test's own process while it runs and that no import reads:
# pytest's name of the current test, and what torch sets once it ran. A worker gets the
# caller's whole environment either way; these do not call for a server of their own.
_RUNTIME_VARS = frozenset(
    {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_NVML_BASED_CUDA_CHECK"}
)


def _enabled(preload: Sequence[str]) -> bool:
    return (
        bool(preload)
        and sys.platform.startswith("linux")
        and os.environ.get("PIPEKIT_TEST_FORK_SERVER", "1") != "0"
    )


class ForkedProcess:
    """A worker forked by the server, with the parts of `subprocess.Popen` tests use."""

    def __init__(self, server: _Server, pid: int, out: Path, err: Path):
        self._server = server
        self.pid = pid
        self.returncode: int | None = None
        self._out, self._err = out, err
        self._output: tuple[str, str] | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        if self._output is None:
            self._output = (
                self._out.read_text(errors="replace"),
                self._err.read_text(errors="replace"),
            )
            shutil.rmtree(self._out.parent, ignore_errors=True)
        return self._output

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass


class _Server:
    def __init__(self, preload: Sequence[str], env: Mapping[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER_MAIN, ",".join(preload)],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()
        assert self.proc.stdout is not None
        hello = json.loads(self.proc.stdout.readline() or "{}")
        self.usable = bool(hello.get("ready"))
        self._pending: list[int] = []
        self._answer = threading.Condition(self._lock)
        self._spawning = threading.Lock()
        if self.usable:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._answer:
                if "exit" in msg:
                    self._exits[msg["exit"]] = msg["returncode"]
                else:
                    self._pending.append(msg["pid"])
                self._answer.notify_all()
        with self._answer:
            self.usable = False
            self._answer.notify_all()

    def spawn(
        self, argv: Sequence[str], env: dict[str, str], cwd: str, out: Path, err: Path
    ) -> int | None:
        assert self.proc.stdin is not None
        request = {"argv": argv, "env": env, "cwd": cwd, "stdout": str(out), "stderr": str(err)}
        # one request at a time: the server answers pids in order, so two threads spawning
        # at once must not take each other's pid
        with self._spawning, self._answer:
            if not self.usable:
                return None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            while not self._pending and self.usable:
                self._answer.wait(60)
            return self._pending.pop(0) if self._pending else None

    def returncode(self, pid: int) -> int | None:
        with self._lock:
            if pid not in self._exits and not self.usable:
                raise RuntimeError(f"the fork server of worker {pid} ended before it")
            return self._exits.get(pid)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def spawn_python(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    preload: Sequence[str] = (),
    cwd: str | os.PathLike[str] | None = None,
) -> ForkedProcess | subprocess.Popen[str]:
    """Start `python *args` (`["-m", module, ...]` or `[script, ...]`), forked from a server.

    The server imported `preload` once; the child then runs as that command would, with
    `env`, in `cwd` (default: this process's working directory). Returns a `ForkedProcess` (`pid`, `poll`,
    `wait`, `communicate`, `kill`, `returncode`), or, where forking is off or unsafe, a
    `subprocess.Popen` with text pipes that answers the same calls.
    """
    args = [str(a) for a in args]
    if (
        not args
        or (args[0] == "-m" and len(args) < 2)
        or (args[0].startswith("-") and args[0] != "-m")
    ):
        raise ValueError(
            f"Received: args={args!r}, but expected ['-m', module, ...] or [script, ...]."
        )
    if _enabled(preload):
        key = (tuple(preload), tuple(sorted(i for i in env.items() if i[0] not in _RUNTIME_VARS)))
        with _LOCK:
            server = _SERVERS.get(key)
            if server is None or server.proc.poll() is not None:
                if len(_SERVERS) >= _MAX_SERVERS:
                    _SERVERS.pop(next(iter(_SERVERS))).close()
                server = _SERVERS[key] = _Server(preload, env)
        if server.usable:
            folder = Path(tempfile.mkdtemp(prefix="pipekit-forked-"))
            out, err = folder / "stdout", folder / "stderr"
            out.touch()  # there even if the worker dies before it opens them
            err.touch()
            pid = server.spawn(args, dict(env), os.fspath(cwd or os.getcwd()), out, err)
            if pid is not None:
                return ForkedProcess(server, pid, out, err)
    return subprocess.Popen(
        [sys.executable, *args],
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_python(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    preload: Sequence[str] = (),
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """`spawn_python`, waited for: as `subprocess.run([sys.executable, *args], ...)` with
    `capture_output=True, text=True` (the child is killed if it outlives `timeout`)."""
    proc = spawn_python(args, env=env, preload=preload, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    assert proc.returncode is not None
    return subprocess.CompletedProcess([sys.executable, *args], proc.returncode, out, err)


# --------------------------------------------------------------------------- the server
#: Native threads known to survive a fork (jemalloc's, started by pyarrow, has fork handlers).
_FORK_SAFE_THREADS = {"jemalloc_bg_thd"}


def _unsafe_threads() -> list[str]:
    """The names of this process's threads other than the main one that may hold a lock."""
    try:
        tasks = [t for t in os.listdir("/proc/self/task") if int(t) != os.getpid()]
        names = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in tasks]
    except OSError:
        return ["unknown"]  # cannot tell: do not fork
    return [name for name in names if name not in _FORK_SAFE_THREADS]


def _serve(preload: Sequence[str]) -> dict[str, Any] | None:
    """Import `preload`, then fork one child per request. Returns in a child only."""
    import importlib

    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # nothing the imports print reaches the channel
    for name in preload:
        importlib.import_module(name)
    unsafe = _unsafe_threads()
    if unsafe:
        channel.write(json.dumps({"ready": False, "threads": unsafe}) + "\n")
        return None
    channel.write(json.dumps({"ready": True}) + "\n")
    children: set[int] = set()
    stdin = sys.stdin
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.02 if children else 1.0)
        if readable:
            line = stdin.readline()
            if not line:
                return None
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                channel.close()
                return request
            children.add(pid)
            channel.write(json.dumps({"pid": pid}) + "\n")
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            channel.write(json.dumps({"exit": pid, "returncode": code}) + "\n")


def _become(request: dict[str, Any]) -> None:
    """In the child: the request's environment, working directory, output and `sys.argv`."""
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"][1:] if request["argv"][0] == "-m" else request["argv"])


def _exit_status(code: object) -> int:
    """The exit status `sys.exit(code)` gives (its message, if any, goes to stderr)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_child(request: dict[str, Any]) -> None:
    """Run the request's module or script as `__main__`, then exit as the interpreter would.

    The interpreter's own shutdown would then free every module the server imported, and
    touching each object's reference count copies the server's memory page by page into
    the child (~1.5 s after `import lightning`). So the child does what shutdown does for
    a program — joins its non-daemon threads, runs the atexit handlers, flushes its
    output — and leaves with `os._exit`.
    """
    import atexit
    import runpy
    import traceback

    _become(request)
    try:
        argv = request["argv"]
        if argv[0] == "-m":
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python script`
            runpy.run_path(argv[0], run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = _exit_status(exit_.code)
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # private: what shutdown calls
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(status)


def main() -> None:
    preload = [name for name in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if name]
    request = _serve(preload)
    if request is not None:
        _run_child(request)
