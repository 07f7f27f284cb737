"""APEBench side by side: its trainer and pipekit-train's `TrainingLoop` on its scenarios.

APEBench (Koehler et al., NeurIPS 2024; `apebench` with `exponax`, `pdequinox` and
`trainax`) is an optional peer, never a dependency. Run it with

    uv run --with apebench==0.1.1 python benchmarks/bench_apebench.py --quick
    uv run --with apebench==0.1.1 python benchmarks/bench_apebench.py          # everything
    uv run --with apebench==0.1.1 python benchmarks/bench_apebench.py --gate   # the gate only
    uv run --with apebench==0.1.1 python benchmarks/bench_apebench.py \\
        --scenario diff_ks --network Conv --config one --updates 10000 --seeds 0 1 2

Without apebench installed the script prints one row saying so (and how to install it)
and exits 0, so `run_all.py` and the test suite run without it; it is not in `.ci/run`.

**What it compares.** For each cell (scenario × network × training configuration ×
updates) and each seed, in one process and from the same initial weights (asserted
bit-identical): APEBench's own pipeline (its scenario's data, `get_neural_stepper` with
the key APEBench splits from the seed, its trainer from `get_trainer`, trained with the
shuffle key it splits) and the library's public API (`TrainingLoop` with an
`EquinoxModelOp(layout="channels_first")` whose factory builds the pdequinox network from
the op's key exactly as APEBench does for that seed, `TrajectoryWindows` over the same
training trajectories, `Rollout(steps=5, reduction="sum")` for `sup;5`,
`Rollout(steps=5, target="diverted", ref_stepper=<the scenario's exponax stepper>,
reduction="sum")` for `div;5`, evaluated with `NeuralForward(...).rollout`). The library
seeds its data order and the op with the same seed; the data orders differ (each side
shuffles with its own generator), so per-seed results differ as two seeds would, and
the medians are what the targets judge. Both trained networks are rolled out 200 steps
from the 30 test initial states (APEBench's with `exponax.rollout`, the code of its
`perform_test_rollout`; the library's with `NeuralForward(...).rollout`) and scored by
APEBench's metric code, `scenario.perform_tests_on_rollout`: the mean nRMSE over the test trajectories at steps 1, 100 and 200, and
gmean100, the geometric mean over steps 1–100 of that mean nRMSE (as
`apebench.aggregate_gmean(up_to=100)`, which applies `scipy.stats.gmean`).
Training time is the wall time of one training call on each side, compile included
(each side's first and only run of that seed; APEBench's trainer without its tqdm bar,
the library with `progress=False`); the side that runs first alternates with the seed.
APEBench's `run_raw` trains its seeds under `eqx.filter_vmap`; here its trainer runs one
seed at a time, and so does the library unless `--group` trains a cell's seeds in one
`SeedGroup`. The `Torch()` and Keras-jax cells (the same networks written in torch and
Keras, started from the pdequinox weights) are `benchmarks/apebench_nets.py --cells`.

Scenarios `diff_ks` (seeds 0–2), `diff_adv` (seeds 0–4) and `diff_burgers` (seeds
0–2); networks `Conv;26;10;relu` and `FNO;12;8;4;gelu`; configurations `one` at 10 000
updates (APEBench's default schedule: Adam, warm-up cosine from 0 to 1e-3 over 2 000
updates) and `one`, `sup;5`, `div;5` at 2 000 updates (warm-up 400); APEBench's other
defaults (N=160, 50 training trajectories of 50 steps, 30 test trajectories of 200
steps, batch 20).

**The exactness gate** (`--gate`, also the start of the default run): fed APEBench's
exact batches (trainax's `PermutationMixer` order for the seed, laid out as one-window
trajectories so plain `TrajectoryWindows` with `shuffle=False` yields them in order),
the library's per-update loss must match trainax's within 1e-5 relative over 300
updates (FNO on `diff_ks`, a 300-update warm-up cosine schedule) for `one`, `sup;5` and
`div;5`; the initial weights and the evaluation path (the library's rollout of
APEBench's trained network against `exponax.rollout` of it) must be bit-identical.

**How long** (measured on this project's 2-core CPU while other jobs ran, load 2.6–6.6):
`--quick` (the gate at 50 updates, then `diff_ks` with the Conv net, `one`, `sup;5`,
`div;5` at 200 updates, seed 0) 4.3 minutes; the gate at 300 updates about 3 minutes;
one seed of `one` at 10 000 updates with the Conv net 125–260 s of training a side, and
the four `diff_ks` Conv cells (3 seeds each, both sides) 65 minutes. The full run (every
cell: 11 seeds × 2 sides per network and configuration) takes many hours on this CPU, so run
the cells you need with the flags, with `--json` and `--markdown` (both rewritten after
each cell, so an interrupted run keeps the cells it finished).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `_shared`, also when loaded by path
from _shared import make_parser, row, write_rows  # noqa: E402

TOPIC = "apebench"
#: this file's module name (`benchmarks/` is on `sys.path`): the factory and the steppers
#: are named by it, so the library's plans can import them
MODULE = "bench_apebench"
INSTALL = "uv run --with apebench==0.1.1 python benchmarks/bench_apebench.py"
SCENARIOS = ("diff_ks", "diff_adv", "diff_burgers")
SEEDS = {"diff_ks": (0, 1, 2), "diff_adv": (0, 1, 2, 3, 4), "diff_burgers": (0, 1, 2)}
NETWORKS = {"Conv": "Conv;26;10;relu", "FNO": "FNO;12;8;4;gelu"}
#: (configuration, updates, warm-up updates), in the order the full run takes them
CELLS = (("one", 10_000, 2_000), ("sup;5", 2_000, 400), ("div;5", 2_000, 400), ("one", 2_000, 400))
#: the targets of issue 62's "Done when": the median gmean100 ratio per scenario
MEDIAN_TARGET = {"diff_ks": 1.10, "diff_adv": 1.25}
SEED_GMEAN_TARGET = 1.10
TIME_TARGET = 1.10
GATE_RTOL = 1e-5
BATCH = 20
HORIZON = 200


def apebench_missing() -> str | None:
    """Why apebench cannot be used here (None: it can)."""
    for name in ("apebench", "exponax", "pdequinox", "trainax"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed"
    return None


# -- APEBench's pieces, importable by name (the library's plans record these names) ------
@functools.cache
def scenario(name: str, updates: int = 10_000, warmup: int = 2_000) -> Any:
    """APEBench's scenario `name` with its defaults and an Adam warm-up cosine schedule."""
    import apebench

    optim = f"adam;{updates};warmup_cosine;0.0;1e-3;{warmup}"
    return apebench.scenarios.scenario_dict[name](optim_config=optim)


@functools.cache
def scenario_data(name: str) -> tuple[Any, Any]:
    """`(train, test)` trajectories of a scenario as numpy float32, `(n, T + 1, C, N)`."""
    import numpy as np

    s = scenario(name)
    return np.asarray(s.get_train_data()), np.asarray(s.get_test_data())


def ape_network(*, scenario_name: str, network: str, key: Any) -> Any:
    """The pdequinox network APEBench builds for the seed whose key is `key`.

    APEBench splits `PRNGKey(seed)` into `(init_key, shuffle_key)` and initialises the
    network with `init_key`; `EquinoxModelOp(seed=s)` calls this with `PRNGKey(s)`.
    """
    import jax

    init_key, _ = jax.random.split(key)
    return scenario(scenario_name).get_neural_stepper(
        task_config="predict", network_config=network, key=init_key
    )


@functools.cache
def _ref_stepper(name: str) -> Any:
    import jax

    # built eagerly even when first called inside a trace (the probe, the compiled step):
    # the stepper's precomputed arrays must not be tracers that outlive it
    with jax.ensure_compile_time_eval():
        return jax.vmap(scenario(name).get_ref_stepper())


def ref_diff_ks(state: Any) -> Any:
    """`diff_ks`'s exponax reference stepper on a batch of states `(B, C, N)`."""
    return _ref_stepper("diff_ks")(state)


def ref_diff_adv(state: Any) -> Any:
    """`diff_adv`'s exponax reference stepper on a batch of states `(B, C, N)`."""
    return _ref_stepper("diff_adv")(state)


def ref_diff_burgers(state: Any) -> Any:
    """`diff_burgers`'s exponax reference stepper on a batch of states `(B, C, N)`."""
    return _ref_stepper("diff_burgers")(state)


REF_STEPPERS: dict[str, Callable[[Any], Any]] = {
    "diff_ks": ref_diff_ks,
    "diff_adv": ref_diff_adv,
    "diff_burgers": ref_diff_burgers,
}


# -- the pieces of one cell -----------------------------------------------------------------
def rollout_steps(config: str) -> int:
    """The unrolled steps of a configuration (`one`: 1)."""
    return 1 if config == "one" else int(config.split(";")[1])


def library_rollout(config: str, scenario_name: str) -> Any:
    """The `Rollout` of a configuration (None for one-step training)."""
    from pipekit_train.core import Rollout

    if config == "one":
        return None
    kind, steps = config.split(";")
    if kind == "sup":
        return Rollout(steps=int(steps), reduction="sum")
    if kind == "div":
        return Rollout(
            steps=int(steps),
            target="diverted",
            ref_stepper=f"{MODULE}:{REF_STEPPERS[scenario_name].__name__}",
            reduction="sum",
        )
    raise SystemExit(f"unknown configuration {config!r}; use one, sup;5 or div;5")


def optimizer_config(updates: int, warmup: int) -> dict[str, Any]:
    """APEBench's optimizer (`adam;U;warmup_cosine;0.0;1e-3;W`) in the library's JSON."""
    return {
        "name": "adam",
        "learning_rate": {
            "schedule": "warmup_cosine",
            "init_value": 0.0,
            "peak_value": 1e-3,
            "warmup_steps": warmup,
            "decay_steps": updates,
        },
    }


def model_op(scenario_name: str, network: str, seed: int) -> Any:
    """The library's model operator for the seed (Equinox; the Torch()/Keras cells are
    `benchmarks/apebench_nets.py --cells`)."""
    from pipekit_train.equinox import EquinoxModelOp

    return EquinoxModelOp(
        f"{MODULE}:ape_network",
        seed=seed,
        layout="channels_first",
        scenario_name=scenario_name,
        network=network,
    )


def same_leaves(a: Any, b: Any) -> bool:
    """Whether two Equinox modules hold bit-identical arrays."""
    import equinox as eqx
    import jax
    import numpy as np

    la = jax.tree.leaves(eqx.filter(a, eqx.is_array))
    lb = jax.tree.leaves(eqx.filter(b, eqx.is_array))
    return len(la) == len(lb) and all(
        x.shape == y.shape and x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(la, lb, strict=True)
    )


def ape_train(scenario_name: str, network: str, config: str, updates: int, warmup: int, seed: int):
    """APEBench's pipeline for one seed: `(trained network, seconds, initial network)`."""
    import jax

    s = scenario(scenario_name, updates, warmup)
    init_key, shuffle_key = jax.random.split(jax.random.PRNGKey(seed))
    net0 = s.get_neural_stepper(task_config="predict", network_config=network, key=init_key)
    trainer = s.get_trainer(train_config=config)
    t0 = time.perf_counter()
    trained, _loss, _aux = trainer(
        net0, shuffle_key, record_loss_every=s.record_loss_every, spawn_tqdm=False
    )
    jax.block_until_ready(jax.tree.leaves(trained))
    return trained, time.perf_counter() - t0, net0


def library_train(
    scenario_name: str,
    network: str,
    config: str,
    updates: int,
    warmup: int,
    seeds: Sequence[int],
    *,
    group: bool = False,
) -> list[tuple[Any, float, Any]]:
    """The library's pipeline for each seed: `[(artifact, seconds, initial op), ...]`.

    Member `s` is the loop with the op seeded `seed=s` and the loop seeded `seed=s`: one
    `TrainingLoop` per seed, or with `group=True` one `SeedGroup(loop, seeds=[...])` for
    all of them (each seed's seconds are then the group's wall time over the seeds).
    """
    from pipekit_train.core import SeedGroup, TrainingLoop, TrajectoryWindows

    train, _ = scenario_data(scenario_name)
    windows = TrajectoryWindows(train, k=rollout_steps(config))

    def loop_of(seed: int) -> Any:
        return TrainingLoop(
            model_op(scenario_name, network, seed),
            windows,
            loss="mse",
            optimizer_config=optimizer_config(updates, warmup),
            batch_size=BATCH,
            max_steps=updates,
            seed=seed,
            progress=False,
            rollout=library_rollout(config, scenario_name),
        )

    if group:
        members = SeedGroup(loop_of(seeds[0]), seeds=list(seeds))
        t0 = time.perf_counter()
        artifacts = members.run()
        each = (time.perf_counter() - t0) / len(seeds)
        return [(a, each, p.model) for a, p in zip(artifacts, members.plans, strict=True)]
    out = []
    for seed in seeds:
        loop = loop_of(seed)
        t0 = time.perf_counter()
        artifact = loop.run()
        out.append((artifact, time.perf_counter() - t0, loop.plan.model))
    return out


def ape_test_rollout(network: Any, scenario_name: str) -> Any:
    """APEBench's rollout of the test initial states, `(30, 200, C, N)`, no init: the
    code of `BaseScenario.perform_test_rollout` (`exponax.rollout` vmapped over the
    states), on the test data generated once instead of once per metric."""
    import exponax as ex
    import jax
    import numpy as np

    _, test = scenario_data(scenario_name)
    return np.asarray(jax.vmap(ex.rollout(network, HORIZON, include_init=False))(test[:, 0]))


def library_test_rollout(model: Any, scenario_name: str) -> Any:
    """The library's rollout of the test initial states: `(30, 200, C, N)`, no init."""
    import numpy as np

    from pipekit_train.core import NeuralForward

    _, test = scenario_data(scenario_name)
    states = NeuralForward(model, state_ndim=test.ndim - 2).rollout(test[:, 0], HORIZON)
    return np.moveaxis(np.asarray(states)[1:], 0, 1)


def scores(metric: Any) -> dict[str, float]:
    """nRMSE at steps 1, 100, 200 and gmean100 of a mean-nRMSE rollout `(1, 200)`."""
    import numpy as np
    from scipy.stats import gmean

    m = np.asarray(metric).reshape(-1)
    return {
        "nrmse1": float(m[0]),
        "nrmse100": float(m[99]),
        "nrmse200": float(m[HORIZON - 1]),
        "gmean100": float(gmean(m[:100])),
    }


def _gmean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# -- one cell ---------------------------------------------------------------------------
def run_cell(
    scenario_name: str,
    net_name: str,
    config: str,
    updates: int,
    warmup: int,
    seeds: Sequence[int],
    *,
    group: bool,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Both pipelines for every seed of one cell; the per-seed scores and times."""
    network = NETWORKS[net_name]
    s = scenario(scenario_name, updates, warmup)
    _, test = scenario_data(scenario_name)
    per_seed = []
    grouped: dict[int, Any] | None = None
    if group:  # the library's seeds in one SeedGroup, before APEBench's seeds one by one
        trained = library_train(
            scenario_name, network, config, updates, warmup, list(seeds), group=True
        )
        grouped = dict(zip(seeds, trained, strict=True))
    for seed in seeds:
        ape = functools.partial(ape_train, scenario_name, network, config, updates, warmup, seed)
        lib = functools.partial(
            library_train,
            scenario_name,
            network,
            config,
            updates,
            warmup,
            [seed],
        )
        if grouped is not None:
            ape_net, ape_s, net0 = ape()
            art, lib_s, op0 = grouped[seed]
        elif seed % 2 == 0:  # the side that runs first alternates with the seed
            ape_net, ape_s, net0 = ape()
            ((art, lib_s, op0),) = lib()
        else:
            ((art, lib_s, op0),) = lib()
            ape_net, ape_s, net0 = ape()
        if not same_leaves(op0.model, net0):
            raise AssertionError(
                f"initial weights differ for {scenario_name} {net_name} seed {seed}"
            )
        ape_rollout = ape_test_rollout(ape_net, scenario_name)
        ape_m = scores(s.perform_tests_on_rollout(ape_rollout, test[:, 1:])["mean_nRMSE"])
        lib_rollout = library_test_rollout(art.model, scenario_name)
        lib_m = scores(s.perform_tests_on_rollout(lib_rollout, test[:, 1:])["mean_nRMSE"])
        result = {"seed": seed, "ape": ape_m, "lib": lib_m, "ape_s": ape_s, "lib_s": lib_s}
        per_seed.append(result)
        log(
            f"  seed {seed}: gmean100 APEBench {ape_m['gmean100']:.4f} library "
            f"{lib_m['gmean100']:.4f} (x{lib_m['gmean100'] / ape_m['gmean100']:.3f}); "
            f"training {ape_s:.1f} s / {lib_s:.1f} s"
        )
    return {
        "scenario": scenario_name,
        "network": net_name,
        "config": config,
        "updates": updates,
        "warmup": warmup,
        "seeds": per_seed,
    }


def cell_rows(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """run_all rows of one cell: per seed, then the median, the geometric mean of the
    per-seed ratios and the training-time ratio."""
    name = f"{cell['scenario']} / {cell['network']} / {cell['config']} / {cell['updates']}"
    seeds = cell["seeds"]
    rows = []
    for r in seeds:
        a, b = r["ape"], r["lib"]
        rows.append(
            row(
                TOPIC,
                f"{name}, seed {r['seed']}",
                "library gmean100 (ratio: ÷ APEBench's)",
                b["gmean100"],
                "nRMSE",
                ratio=b["gmean100"] / a["gmean100"],
                digits=4,
                note=(
                    f"APEBench gmean100 {a['gmean100']:.4f}; nRMSE@1/100/200 APEBench "
                    f"{a['nrmse1']:.4f}/{a['nrmse100']:.4f}/{a['nrmse200']:.4f}, library "
                    f"{b['nrmse1']:.4f}/{b['nrmse100']:.4f}/{b['nrmse200']:.4f}; training "
                    f"{r['ape_s']:.1f} s / {r['lib_s']:.1f} s"
                ),
            )
        )
    ape_med = statistics.median(r["ape"]["gmean100"] for r in seeds)
    lib_med = statistics.median(r["lib"]["gmean100"] for r in seeds)
    target = MEDIAN_TARGET.get(cell["scenario"])
    ratio = lib_med / ape_med
    rows.append(
        row(
            TOPIC,
            f"{name}, seeds {seeds[0]['seed']}-{seeds[-1]['seed']}",
            "median library gmean100 (ratio: ÷ APEBench's median)",
            lib_med,
            "nRMSE",
            ratio=ratio,
            target=None if target is None else f"<= {target}",
            ok=None if target is None else ratio <= target,
            digits=4,
            note=f"APEBench median {ape_med:.4f}",
        )
    )
    g = _gmean([r["lib"]["gmean100"] / r["ape"]["gmean100"] for r in seeds])
    rows.append(
        row(
            TOPIC,
            f"{name}, seeds {seeds[0]['seed']}-{seeds[-1]['seed']}",
            "geometric mean of the per-seed gmean100 ratios",
            g,
            "x",
            ratio=g,
            target=f"<= {SEED_GMEAN_TARGET}",
            ok=g <= SEED_GMEAN_TARGET,
        )
    )
    ape_t = sum(r["ape_s"] for r in seeds)
    lib_t = sum(r["lib_s"] for r in seeds)
    rows.append(
        row(
            TOPIC,
            f"{name}, seeds {seeds[0]['seed']}-{seeds[-1]['seed']}",
            "library training s, all seeds, compile included (ratio: ÷ APEBench's)",
            lib_t,
            "s",
            ratio=lib_t / ape_t,
            target=f"<= {TIME_TARGET}",
            ok=lib_t / ape_t <= TIME_TARGET,
            digits=1,
            note=f"APEBench {ape_t:.1f} s",
        )
    )
    return rows


def cell_markdown(cell: dict[str, Any]) -> str:
    """One markdown table row of a cell (the docs page's table)."""
    seeds = cell["seeds"]
    ape = [r["ape"]["gmean100"] for r in seeds]
    lib = [r["lib"]["gmean100"] for r in seeds]
    ratios = [b / a for a, b in zip(ape, lib, strict=True)]
    ape_t = [r["ape_s"] for r in seeds]
    lib_t = [r["lib_s"] for r in seeds]
    n1 = statistics.median(r["ape"]["nrmse1"] for r in seeds)
    l1 = statistics.median(r["lib"]["nrmse1"] for r in seeds)
    n200 = statistics.median(r["ape"]["nrmse200"] for r in seeds)
    l200 = statistics.median(r["lib"]["nrmse200"] for r in seeds)
    ids = [r["seed"] for r in seeds]
    return (
        f"| {cell['scenario']} / {cell['network']} / {cell['config']} / {cell['updates']:,} "
        f"| {ids[0]}–{ids[-1]} | {statistics.median(ape):.3f} | {statistics.median(lib):.3f} "
        f"| {statistics.median(lib) / statistics.median(ape):.2f} | {_gmean(ratios):.2f} "
        f"({min(ratios):.2f}–{max(ratios):.2f}) | {n1:.4f} / {l1:.4f} | {n200:.3f} / {l200:.3f} "
        f"| {sum(ape_t):.0f} / {sum(lib_t):.0f} ({sum(lib_t) / sum(ape_t):.2f}) |"
    )


MARKDOWN_HEADER = (
    "| scenario / network / config / updates | seeds | APEBench gmean100 (median) "
    "| library (median) | median ratio | per-seed ratio, gmean (range) "
    "| nRMSE@1 APEBench / library (median) | nRMSE@200 APEBench / library (median) "
    "| training s APEBench / library, all seeds (ratio) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


# -- the exactness gate -------------------------------------------------------------------
def gate(
    updates: int, log: Callable[[str], None], scenario_name: str = "diff_ks", net: str = "FNO"
) -> list[dict[str, Any]]:
    """Feed the library APEBench's exact batches; compare per-update losses, initial
    weights and the evaluation path. Returns run_all rows."""
    import jax
    import numpy as np
    import trainax

    from pipekit_train.core import TrainingLoop, TrajectoryWindows

    network, seed, warmup = NETWORKS[net], 0, max(1, updates // 5)
    s = scenario(scenario_name, updates, warmup)
    train, test = scenario_data(scenario_name)
    rows = []
    for config in ("one", "sup;5", "div;5"):
        k = rollout_steps(config)
        init_key, shuffle_key = jax.random.split(jax.random.PRNGKey(seed))
        net0 = s.get_neural_stepper(task_config="predict", network_config=network, key=init_key)
        trainer = s.get_trainer(train_config=config)
        stacker = trainer.trajectory_sub_stacker
        mixer = trainax.PermutationMixer(stacker.num_total_samples, updates, BATCH, shuffle_key)
        order = np.concatenate([np.asarray(mixer(i)) for i in range(updates)])
        # all windows of k + 1 states, trajectory-major as trainax stacks them
        starts = train.shape[1] - k
        windows_all = np.stack([train[:, t : t + k + 1] for t in range(starts)], axis=1)
        windows_all = windows_all.reshape(-1, *windows_all.shape[2:])
        assert np.array_equal(windows_all[:, 0], np.asarray(stacker.data_sub_trajectories)[:, 0])
        fed = np.ascontiguousarray(windows_all[order])  # one window per "trajectory", in order
        trained, ape_losses, _ = trainer(net0, shuffle_key, record_loss_every=1, spawn_tqdm=False)
        op = model_op(scenario_name, network, seed)
        weights_same = same_leaves(op.model, net0)
        artifact = TrainingLoop(
            op,
            TrajectoryWindows(fed, k=k),
            loss="mse",
            optimizer_config=optimizer_config(updates, warmup),
            batch_size=BATCH,
            max_steps=updates,
            seed=seed,
            shuffle=False,
            progress=False,
            log_every_n_steps=1,
            rollout=library_rollout(config, scenario_name),
        ).run()
        steps, lib_losses = artifact.history.series("loss")
        ape_l = np.asarray(ape_losses, np.float64)
        lib_l = np.asarray(lib_losses, np.float64)
        if len(lib_l) != updates:
            raise AssertionError(f"the library recorded {len(lib_l)} losses, not {updates}")
        rel = float(np.max(np.abs(lib_l - ape_l) / np.abs(ape_l)))
        # the evaluation path: the library's rollout of the *same* (APEBench-trained) network
        ape_roll = ape_test_rollout(trained, scenario_name)
        lib_roll = library_test_rollout(op.with_model(trained), scenario_name)
        eval_same = bool(np.array_equal(ape_roll, lib_roll))
        eval_diff = float(np.max(np.abs(ape_roll - lib_roll)))
        ok = rel <= GATE_RTOL and weights_same and eval_same
        log(
            f"  gate {config}: max relative loss difference {rel:.2e} over {updates} updates; "
            f"initial weights identical: {weights_same}; evaluation rollout identical: "
            f"{eval_same} (max |diff| {eval_diff:.1e})"
        )
        rows.append(
            row(
                TOPIC,
                f"gate: {scenario_name} / {net} / {config}, APEBench's batches, {updates} updates",
                "max relative per-update loss difference",
                rel,
                "",
                target=f"<= {GATE_RTOL:g}, initial weights and evaluation rollout bit-identical",
                ok=ok,
                digits=None,
                note=(
                    f"initial weights identical: {weights_same}; evaluation rollout "
                    f"identical: {eval_same} (max |diff| {eval_diff:.1e})"
                ),
            )
        )
    return rows


# -- the command line ---------------------------------------------------------------------
def _parser() -> Any:
    parser = make_parser(
        __doc__,
        quick_help="the gate at 50 updates and diff_ks / Conv / one, sup;5, div;5 at 200 "
        "updates, seed 0 (about 4 minutes)",
        markdown_help="also write the cells' markdown table to PATH (rewritten after each cell)",
    )
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, help="scenarios (default all)")
    parser.add_argument("--network", nargs="+", choices=tuple(NETWORKS), help="networks")
    parser.add_argument(
        "--config", nargs="+", choices=("one", "sup;5", "div;5"), help="configurations"
    )
    parser.add_argument(
        "--updates",
        type=int,
        nargs="+",
        help="only the cells of these update counts (10000, 2000); with --quick, the count",
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default per scenario)")
    parser.add_argument("--gate", action="store_true", help="run the exactness gate only")
    parser.add_argument("--no-gate", action="store_true", help="skip the exactness gate")
    parser.add_argument("--gate-updates", type=int, default=300, help="updates of the gate")
    parser.add_argument(
        "--group",
        action="store_true",
        help="train the library's seeds of a cell in one SeedGroup (Equinox's group step: "
        "vmapped on an accelerator, each member's own step in turn on the CPU)",
    )
    return parser


def planned_cells(args: Any) -> list[tuple[str, str, str, int, int, tuple[int, ...]]]:
    """`(scenario, network, config, updates, warm-up, seeds)` of the cells to run."""
    if args.quick:
        updates = (args.updates or [200])[0]
        base = [(c, updates, max(1, updates // 5)) for c in ("one", "sup;5", "div;5")]
        scen, nets, seeds = ["diff_ks"], ["Conv"], [0]
    else:
        base, scen, nets, seeds = list(CELLS), list(SCENARIOS), list(NETWORKS), None
    scen = args.scenario or scen
    nets = args.network or nets
    out = []
    for net in nets:
        for sc in scen:
            for config, updates, warmup in base:
                if args.config and config not in args.config:
                    continue
                if args.updates and not args.quick and updates not in args.updates:
                    continue
                chosen = tuple(args.seeds or seeds or SEEDS[sc])
                out.append((sc, net, config, updates, warmup, chosen))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    missing = apebench_missing()
    if missing:
        note = f"{missing}; it is an optional peer: run `{INSTALL}`"
        print(f"bench_apebench: skipped ({note}).")
        if args.json:
            write_rows(args.json, [row(TOPIC, "(the script)", "not run", None, "", note=note)])
        return 0
    if args.group and args.gate:
        raise SystemExit("--group does not apply to --gate (the gate trains one seed)")

    def log(text: str) -> None:
        print(text, flush=True)

    rows: list[dict[str, Any]] = []
    markdown = [MARKDOWN_HEADER]

    def flush() -> None:
        if args.json:
            write_rows(args.json, rows)
        if args.markdown:
            Path(args.markdown).write_text("\n".join(markdown) + "\n")

    t_start = time.perf_counter()
    if not args.no_gate:
        gate_updates = 50 if args.quick else args.gate_updates
        log(f"== exactness gate (diff_ks / FNO, {gate_updates} updates)")
        rows += gate(gate_updates, log)
        flush()
    if not args.gate:
        for sc, net, config, updates, warmup, seeds in planned_cells(args):
            log(
                f"== {sc} / {net} / {config} / {updates} updates (warm-up {warmup}), seeds "
                f"{seeds} (at {time.perf_counter() - t_start:.0f} s)"
            )
            cell = run_cell(
                sc,
                net,
                config,
                updates,
                warmup,
                seeds,
                group=args.group,
                log=log,
            )
            rows += cell_rows(cell)
            markdown.append(cell_markdown(cell))
            log(markdown[-1])
            flush()
    log(f"== done in {time.perf_counter() - t_start:.0f} s")
    print("\n".join(markdown))
    for r in rows:
        mark = {True: "ok", False: "MISSED", None: ""}[r["ok"]]
        print(f"{r['case']}: {r['metric']} = {r['value']} (ratio {r['ratio']}) {mark}")
    flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
