"""How long a checkpoint blocks the training thread: asynchronous vs synchronous saves.

    uv run python benchmarks/bench_checkpoint.py [--quick] [--mb 50] [--every 50]
        [--location local|s3|both] [--json PATH]

A ~50 MB training state (float32 arrays) is saved every `--every` steps of a simulated
training loop. Each step spends `--step-ms` doing small numpy matmuls on the training
thread, and the number of matmuls done is the loop's training throughput.
Measured side by side, in one process, interleaved over `--repeats` rounds:

- `DirectoryCheckpointer` (core's atomic store, used by the Lightning and Keras adapters,
  the numpy reference and `OnlineTrainer`) with `async_save=False` and with
  `async_save=True`, set up as those adapters do: the training thread copies the state
  into host buffers reused from one save to the next (`HostBuffers`); with async saves
  the encoding, the SHA-256 digests, the writes, the fsyncs and the rename happen on the
  writer thread;
- Orbax through `pipekit_train.equinox`'s `OrbaxCheckpointer`, synchronous and
  asynchronous, set up as the Equinox adapter does in one process (the training thread
  copies the device arrays into reused host buffers; Orbax's write and the digest run on
  the writer thread), when `pipekit-train-equinox` is installed (skipped otherwise);
- with `--location s3` (or `both`), the same with the checkpoint at `s3://` on a moto
  S3 server on loopback (a separate process), each step uploaded with its commit marker
  last;
- the same loop without checkpoints, as the baseline for the wall-time overhead.

Metrics:

- the median time the training thread spends inside `save()`, which is what async
  saving is for;
- the loop's wall time relative to the baseline;
- the training throughput relative to the baseline. Background writes still compete for
  the CPU, and a save waits for the previous one.

Rows follow the convention in `benchmarks/run_all.py`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one training thread: stable step work
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import contextlib
import functools
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _shared import make_parser, write_rows
from _shared import row as row_of

from pipekit_train.core import Checkpoint
from pipekit_train.core.adapter import DirectoryCheckpointer, HostBuffers
from pipekit_train.core.testing import decode_arrays, encode_arrays

META = {"step": 0, "data_iter": {"epoch": 0, "index": 0}, "run": {"history": {}}}


def make_state(mb: float, seed: int = 0) -> dict[str, np.ndarray]:
    """Eight float32 arrays totalling about `mb` megabytes."""
    rng = np.random.default_rng(seed)
    per = int(mb * 1e6 / 4 / 8)
    return {f"layer{i}/w": rng.standard_normal(per, dtype=np.float32) for i in range(8)}


class Work:
    """Numpy matmuls standing in for training steps.

    A step lasts a fixed time and counts the matmuls it completes. The wall time of a
    loop therefore stays bounded on a busy machine, and the matmul rate measures how much
    a background write slows training down.
    """

    def __init__(self, size: int = 128):
        rng = np.random.default_rng(1)
        self.a = rng.standard_normal((size, size), dtype=np.float32)
        self.b = rng.standard_normal((size, size), dtype=np.float32)

    def run_for(self, seconds: float) -> int:
        """Do matmuls for `seconds`; return how many were done."""
        deadline = time.perf_counter() + seconds
        count = 0
        while time.perf_counter() < deadline:
            self.a @ self.b
            count += 1
        return count


# -- where checkpoints go ---------------------------------------------------------------------
class Location:
    """A local temporary folder, or a fresh prefix on the loopback S3 server."""

    def __init__(self, s3: dict[str, Any] | None = None):
        self.s3 = s3

    @contextlib.contextmanager
    def policy(self, async_save: bool) -> Iterator[Checkpoint]:
        if self.s3 is None:
            root = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
            try:
                yield Checkpoint(
                    root / "ckpt", every_n_steps=1, max_to_keep=2, async_save=async_save
                )
            finally:
                shutil.rmtree(root, ignore_errors=True)
            return
        uri = f"s3://{S3_BUCKET}/{uuid.uuid4().hex[:12]}"
        policy = Checkpoint(
            uri, every_n_steps=1, max_to_keep=2, async_save=async_save, storage_options=self.s3
        )
        try:
            yield policy
        finally:
            fs, root = policy.filesystem()
            with contextlib.suppress(FileNotFoundError):
                fs.rm(root, recursive=True)


S3_BUCKET = "pipekit-bench"


@contextlib.contextmanager
def s3_server() -> Iterator[dict[str, Any]]:
    """A moto S3 server in a child process on 127.0.0.1; yields s3fs storage options."""
    import os

    import boto3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    creds = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(creds)
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket=S3_BUCKET)
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield {
            "key": creds["AWS_ACCESS_KEY_ID"],
            "secret": creds["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- checkpointers -------------------------------------------------------------------------
def directory_checkpointer(policy: Checkpoint) -> Any:
    """As the numpy, Lightning and Keras adapters set it up: snapshot into reused buffers."""
    buffers = HostBuffers()
    return DirectoryCheckpointer(
        policy,
        snapshot=lambda state: {k: buffers.copy(k, v) for k, v in state.items()},
        encode=lambda snapshot: {"arrays.bin": encode_arrays(snapshot)},
        decode=lambda blobs, template: decode_arrays(blobs["arrays.bin"]),
    )


def orbax_factory() -> tuple[
    Callable[[Checkpoint], Any] | None, Callable[[dict[str, np.ndarray]], Any] | None, str | None
]:
    """`(make_checkpointer, to_device_state, None)` or `(None, None, why it is skipped)`."""
    try:
        import jax
        import jax.numpy as jnp

        from pipekit_train.equinox._checkpoint import OrbaxCheckpointer
    except Exception as exc:  # not installed, or the adapter is not there yet
        return None, None, f"{type(exc).__name__}: {exc}"

    def make(policy: Checkpoint) -> Any:
        return OrbaxCheckpointer(
            policy,
            # With several processes: fresh device arrays (the adapter donates its buffers).
            to_tree=lambda state: {k: jnp.copy(v) for k, v in state.items()},
            # In one process (this benchmark): the live arrays, copied to host buffers.
            live_tree=lambda state: dict(state),
            template_tree=lambda state: {
                k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in state.items()
            },
            from_tree=lambda tree, template: dict(tree),
        )

    def to_device(state: dict[str, np.ndarray]) -> Any:
        out = {k: jnp.asarray(v) for k, v in state.items()}
        jax.block_until_ready(out)
        return out

    return make, to_device, None


# -- one measured loop -----------------------------------------------------------------------
def run_loop(
    make: Callable[[Checkpoint], Any] | None,
    policy: Checkpoint | None,
    state: Any,
    work: Work,
    step_s: float,
    steps: int,
    every: int,
) -> dict[str, Any]:
    """Run `steps` simulated steps, saving every `every` steps; return the timings."""
    ckpt = make(policy) if make is not None and policy is not None else None
    blocks: list[float] = []
    matmuls = 0
    try:
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            matmuls += work.run_for(step_s)
            if ckpt is not None and step % every == 0:
                t = time.perf_counter()
                ckpt.save(step, state, {**META, "step": step}, {})
                blocks.append(time.perf_counter() - t)
        t = time.perf_counter()
        if ckpt is not None:
            ckpt.wait()
        final_wait = time.perf_counter() - t
        wall = time.perf_counter() - t0
    finally:
        if ckpt is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ckpt.close()
    return {
        "blocks": blocks,
        "wall": wall,
        "final_wait": final_wait,
        "rate": matmuls / (steps * step_s),
    }


# One result row of this benchmark (see _shared.row); value and ratio as measured.
row = functools.partial(row_of, "checkpoint", digits=None, ratio_digits=None)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = make_parser(
        __doc__,
        quick_help="2 rounds of 3 saves, 40 steps apart",
        repeats=3,
        repeats_help="interleaved rounds",
    )
    parser.add_argument("--mb", type=float, default=50.0, help="state size in MB")
    parser.add_argument("--step-ms", type=float, default=20.0, help="simulated step time (ms)")
    parser.add_argument(
        "--every",
        type=int,
        default=50,
        help="steps between saves (leave the background write time to finish)",
    )
    parser.add_argument("--saves", type=int, default=4, help="saves per loop")
    parser.add_argument("--no-orbax", action="store_true")
    parser.add_argument(
        "--location",
        choices=("local", "s3", "both"),
        default="local",
        help="a local folder, s3:// on a loopback moto server, or both",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.saves, args.repeats, args.every = 3, 2, 40
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(s3_server()) if args.location != "local" else None
        return _run(args, s3)


def _run(args: argparse.Namespace, s3: dict[str, Any] | None) -> list[dict[str, Any]]:
    state = make_state(args.mb)
    size_mb = sum(v.nbytes for v in state.values()) / 1e6
    work = Work()
    step_s = args.step_ms / 1e3
    steps = args.every * args.saves

    engines: dict[str, tuple[Callable[[Checkpoint], Any], Any]] = {
        "DirectoryCheckpointer": (directory_checkpointer, state)
    }
    orbax_note = None
    if not args.no_orbax:
        make_orbax, to_device, orbax_note = orbax_factory()
        if make_orbax is not None and to_device is not None:
            engines["Orbax (equinox)"] = (make_orbax, to_device(state))
    locations: dict[str, Location] = {}
    if args.location in ("local", "both"):
        locations[""] = Location()
    if s3 is not None:
        locations[" on s3://"] = Location(s3)
    # name -> (make, location, async_save, state)
    cases: dict[str, tuple[Any, Location | None, bool, Any]] = {
        "no checkpoint": (None, None, False, state)
    }
    for where, location in locations.items():
        for engine, (make, st) in engines.items():
            cases[f"{engine}{where} sync"] = (make, location, False, st)
            cases[f"{engine}{where} async"] = (make, location, True, st)

    results: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, (make, location, async_save, st) in cases.items():  # interleaved
            if location is None:
                results[name].append(run_loop(None, None, st, work, step_s, steps, args.every))
                continue
            with location.policy(async_save) as policy:
                results[name].append(run_loop(make, policy, st, work, step_s, steps, args.every))

    def block_ms(name: str) -> float:
        return 1e3 * statistics.median(b for r in results[name] for b in r["blocks"])

    def wall_s(name: str) -> float:
        return min(r["wall"] for r in results[name])

    def rate(name: str) -> float:
        return statistics.median(r["rate"] for r in results[name])

    base_wall, base_rate = wall_s("no checkpoint"), rate("no checkpoint")
    rows = [
        row(
            "no checkpoint",
            f"loop wall time ({steps} steps of {args.step_ms:.0f} ms)",
            base_wall,
            "s",
            note=f"{size_mb:.0f} MB state, a save every {args.every} steps",
        ),
        row("no checkpoint", "training throughput (matmuls/s in steps)", base_rate, "matmul/s"),
    ]
    print(
        f"state {size_mb:.1f} MB; {steps} steps of {args.step_ms:.0f} ms, a save every {args.every} steps; "
        f"{args.repeats} rounds"
    )
    print(
        f"{'case':<42} {'block/save':>11} {'async/sync':>10} {'loop wall':>10} {'wall x':>7} "
        f"{'train rate x':>13}"
    )
    print(f"{'no checkpoint':<42} {'':>11} {'':>10} {base_wall:9.2f}s {1.0:7.2f} {1.0:13.2f}")
    for where in locations:
        for engine in engines:
            sync, asyn = f"{engine}{where} sync", f"{engine}{where} async"
            b_sync, b_async = block_ms(sync), block_ms(asyn)
            ratio = b_async / b_sync
            rows.append(row(sync, "training-thread block per save (median)", b_sync, "ms"))
            rows.append(
                row(
                    asyn,
                    "training-thread block per save (median)",
                    b_async,
                    "ms",
                    ratio=ratio,
                    target="<= 0.1x sync",
                    ok=ratio <= 0.1,
                )
            )
            for name in (sync, asyn):
                rows.append(
                    row(
                        name,
                        "loop wall time vs no checkpoint",
                        wall_s(name),
                        "s",
                        ratio=wall_s(name) / base_wall,
                    )
                )
                rows.append(
                    row(
                        name,
                        "training throughput (matmuls/s in steps) vs no checkpoint",
                        rate(name),
                        "matmul/s",
                        ratio=rate(name) / base_rate,
                    )
                )
                shown = f"{ratio:9.3f}x" if name == asyn else ""
                print(
                    f"{name:<42} {block_ms(name):9.1f}ms {shown:>10} {wall_s(name):9.2f}s "
                    f"{wall_s(name) / base_wall:7.2f} {rate(name) / base_rate:13.2f}"
                )
    if orbax_note is not None and not args.no_orbax:
        rows.append(row("Orbax (equinox)", "skipped", None, "", note=orbax_note))
        print(f"Orbax skipped: {orbax_note}")

    if args.json:
        write_rows(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
