"""Repository-wide test set-up.

The models in the tests are tiny and the CI machine has 2 cores: intra-op thread pools
(torch's OpenMP, BLAS) only contend with the other processes a test starts (a
kill-and-resume worker, DDP ranks, sweep workers) and can slow a torch step 50-fold.
One thread per process, unless the caller chose otherwise. Subprocesses inherit it.
"""

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# Ray (2.x) reads RAY_ENABLE_UV_RUN_RUNTIME_ENV once, when `ray` is first imported. Under
# `uv run pytest` it is on by default, and then every Ray worker is started through
# `uv run` in a copy of the repository with a venv of its own (tens of seconds per worker
# group). The tests' Ray workers start from this interpreter instead; set here, before any
# test module imports ray.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


# --------------------------------------------------------------------------- compiled programs
# Most of the suite's processes (kill-and-resume workers, golden workers, docs pages, CLI
# runs, the examples) compile the same small jax programs again: jax's persistent
# compilation cache lets every process of one `pytest` run reuse them. The folder is made
# by the first process (the xdist controller), inherited by the workers and their
# subprocesses through the environment, and removed when the run ends. A cached executable
# is the compiled program itself, so results are bit-identical (the golden-run files check
# that across processes). `JAX_COMPILATION_CACHE_DIR` set by the caller is used as is.
# Two processes that compile the same program at once both write it; a reader that ever met
# a half-written entry would get a warning from jax and compile again, never a wrong program.
_JAX_CACHE_OWNER = "PIPEKIT_TEST_JAX_CACHE_OWNER"
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="pipekit-jax-cache-")
    os.environ[_JAX_CACHE_OWNER] = str(os.getpid())
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


# --------------------------------------------------------------------------- test scheduling
# `uv run pytest` runs on three pytest-xdist workers (`-n 3 --dist loadfile` in
# pyproject.toml) on two cores: a third worker fills the time the others spend waiting (on a
# preempted worker's signal, a Ray worker group, a loopback server). Every test file goes
# whole to one worker, so a module fixture (the golden runs, the wheel builds, a Ray
# cluster) is built once. Refinements:
#
# - The golden-run files share one work unit (one set of worker processes for them all).
# - The files that start Ray share one work unit: two Ray runtimes at once would contend
#   for two cores, and `ray.init()` without an address joins a cluster another worker
#   started (`ray.cluster_utils.Cluster` records its address for that).
# - The longest units go first (`LONGEST`), then files with slow tests. Work units are handed
#   out in order as the workers free up, so the run ends on short files and the workers
#   finish together.

from typing import Any  # noqa: E402

import pytest  # noqa: E402

RAY_FILES = (
    "packages/core/tests/test_core_data_cached_ray.py",
    "packages/sweep/tests/test_sweep_ray.py",
    "packages/sweep/tests/test_sweep_lifeline.py",
    "packages/lightning/tests/test_lightning_ray.py",
    "packages/equinox/tests/test_equinox_ray.py",
)


# The golden-run files share one session fixture (`golden_outputs` in
# tests-integration/conftest.py: one worker process per backend for all three suites), so
# they go to one xdist worker together.
GOLDEN_FILES = (
    "tests-integration/test_golden_runs.py",
    "tests-integration/test_golden_plateau.py",
    "tests-integration/test_golden_fields.py",
    "tests-integration/test_golden_flow.py",
    "tests-integration/test_golden_rollout.py",
)


# Each docs page runs in a subprocess of its own and shares nothing with the other pages: one
# work unit per page, so the pages spread over the workers instead of one worker running all
# of them (three to four minutes) in a row.
PER_TEST_FILES = ("tests-integration/test_docs_examples.py",)

# The longest work units (a minute or more each on a loaded 2-core machine, measured with
# `--durations`), handed out first and longest first, so that no long unit starts late and
# keeps one worker busy after the others have finished.
LONGEST = (
    "ray",
    "golden",
    "packages/keras/tests/test_keras_backends.py",
    "tests-integration/test_field_emulator.py",
    "packages/equinox/tests/test_equinox_conformance.py",
    "tests-integration/test_examples.py",
    "packages/keras/tests/test_keras_conformance.py",
    "packages/lightning/tests/test_lightning_torch.py",
    "tests-integration/test_gpu_check.py",
    "tests-integration/test_typecheck.py",
    "packages/lightning/tests/test_lightning_conformance.py",
    "tests-integration/test_plain_torch_adapter.py",
)


def _file_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path in RAY_FILES:
        return "ray"
    if path in PER_TEST_FILES:
        return nodeid
    return "golden" if path in GOLDEN_FILES else path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the work units: the known longest first (longest first), then those with a
    slow test, then the rest (each group in collection order)."""
    heavy = {_file_of(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[int, int]:
        unit = _file_of(item.nodeid)
        if unit in LONGEST:
            return (0, LONGEST.index(unit))
        return (1, 0) if unit in heavy else (2, 0)

    items.sort(key=rank)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the Ray files in one work unit and the collection order kept."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _file_of(nodeid)

    config.option.loadscopereorder = False  # keep the slow-files-first order above
    return Scheduling(config, log)


# --------------------------------------------------------------------------- bytecode
# On a fresh clone no module has its bytecode yet, and the three workers collect at once:
# each compiles the same torch, jax, Lightning, Keras and Ray modules (about 17 s of CPU a
# worker on this machine, of 28 s for a collection). The controller first imports them in
# two processes side by side, which write the bytecode once; the workers then find it. When
# it is already there (any later run) nothing is started.
WARM_IMPORTS = (
    ("torch", "lightning", "sklearn", "scipy.stats", "matplotlib.pyplot", "pandas", "optuna"),
    ("jax", "equinox", "optax", "orbax.checkpoint", "grain", "zarr", "ray", "moto", "keras"),
)


def _has_bytecode(module: str) -> bool:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return True  # not installed: nothing to warm
    return os.path.exists(importlib.util.cache_from_source(spec.origin))


def pytest_configure(config: pytest.Config) -> None:
    """Controller of a parallel run on a fresh environment: write the bytecode of the heavy
    imports once, before the workers start (see above)."""
    import sys

    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    if sys.dont_write_bytecode or all(_has_bytecode(group[0]) for group in WARM_IMPORTS):
        return
    import subprocess

    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import importlib, sys\nfor m in sys.argv[1:]:\n"
                "    try: importlib.import_module(m)\n    except Exception: pass",
                *group,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"KERAS_BACKEND": "jax", **os.environ},  # else keras looks for tensorflow
        )
        for group in WARM_IMPORTS
    ]
    for proc in procs:
        proc.wait()


# --------------------------------------------------------------------------- suite timeline
# `PIPEKIT_SUITE_TIMELINE=path.jsonl uv run pytest` writes one line per test phase as the
# controller receives it: seconds since the run started, the xdist worker, the test, the
# phase and its duration. `scripts/suite_timeline.py path.jsonl` reads it (per worker: the
# units in the order they ran, their wall time, and the idle tail). Each phase also
# carries the CPU seconds its worker process and the children it waited for used since the
# previous phase (`cpu`: wall time on a loaded 2-core machine says little about cost).
_TIMELINE = os.environ.get("PIPEKIT_SUITE_TIMELINE")
_T0 = __import__("time").monotonic()
_CPU_LAST: list[float] = []


def _cpu_seconds() -> float:
    import resource

    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the CPU count of the suite timeline after collection (see above)."""
    if _TIMELINE:
        _CPU_LAST[:] = [_cpu_seconds()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Attach the phase's CPU seconds to its report (suite timeline only; see above)."""
    outcome = yield
    if not _TIMELINE:
        return
    now = _cpu_seconds()
    last = _CPU_LAST[0] if _CPU_LAST else now
    _CPU_LAST[:] = [now]
    outcome.get_result().user_properties.append(("cpu", round(now - last, 2)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Append the report to the suite timeline (controller only; see above)."""
    if not _TIMELINE or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import json
    import time

    node = getattr(report, "node", None)
    worker = node.workerinput["workerid"] if node is not None else "main"
    line = {
        "t": round(time.monotonic() - _T0, 2),
        "worker": worker,
        "test": report.nodeid,
        "unit": _file_of(report.nodeid),
        "when": report.when,
        "duration": round(report.duration, 2),
        "outcome": report.outcome,
        "cpu": dict(report.user_properties).get("cpu"),
    }
    with open(_TIMELINE, "a") as fh:
        fh.write(json.dumps(line) + "\n")


# --------------------------------------------------------------------------- process exit
# When an xdist worker has run its share of the suite, its heap holds millions of objects
# (jax, torch, Keras and Lightning modules, compiled programs, traced functions), and the
# interpreter's finalization walks and frees them all, in the three workers at once: the
# controller waited 12 s from the last test to the end of a fast-tier run (timestamps at
# each process's session end, unconfigure and atexit). A worker has sent its results by its
# last pytest hook (xdist reads them from that message, not from the exit status), so it
# runs the `atexit` handlers and leaves with `os._exit`, as `core.testing`'s fork server's
# children do. Other pytest processes exit normally.
@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the run's jax compilation cache (in the process that made it); end an xdist
    worker without the interpreter's finalization (see above)."""
    if os.environ.get(_JAX_CACHE_OWNER) == str(os.getpid()):
        import shutil

        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    if hasattr(config, "workerinput"):
        import atexit
        import sys

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
