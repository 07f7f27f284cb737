"""`SimulationDataset`: samples computed on demand, deterministically, from a simulator."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from pipekit_train.core._errors import ConfigError, PipekitError

from ._dataset import ArraySpec, Batch, Sample, as_sample, check_key, spec_of, stack_samples
from ._hashing import Hasher, fingerprint_callable
from ._workers import check_workers, compute_blocks

__all__ = ["SimulationDataset", "SimulationError", "simulator_seed"]

OnInvalid = Literal["raise", "resample", "drop"]
_POLICIES = ("raise", "resample", "drop")


class SimulationError(PipekitError, RuntimeError):
    """A simulation failed (raised, or returned non-finite values) and the policy says raise."""


def _takes_rng(simulator: Callable[..., Any]) -> bool:
    """Whether `simulator` has a parameter named `rng` (positional or keyword)."""
    try:
        params = inspect.signature(simulator).parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return False
    rng = params.get("rng")
    return rng is not None and rng.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def simulator_seed(seed: int, index: int, attempt: int = 0) -> np.random.SeedSequence:
    """The seed sequence of the generator a stochastic simulator gets for raw item `index`.

    It is the first child (`spawn_key=(0,)`) of the sampler's seed sequence
    `SeedSequence([seed, index])` (`[seed, index, attempt]` on a resampling attempt), so
    the simulator's noise is independent of the sampler's draws and depends only on
    `(seed, index, attempt)`.
    """
    entropy = [int(seed), int(index)] if attempt == 0 else [int(seed), int(index), int(attempt)]
    return np.random.SeedSequence(entropy, spawn_key=(0,))


def _check_int(name: str, value: Any, *, minimum: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(
            f"`{name}` must be an int >= {minimum}. Received: {name}={value!r}. {hint}"
        )
    return int(value)


class SimulationDataset:
    """A dataset whose item `i` is simulated on demand, deterministically from `(seed, i)`.

    Item `i` is computed as

    ```python
    rng = np.random.default_rng([seed, i])
    params = sampler(rng)          # an array, or a dict of arrays
    out = simulator(params)        # an array, or a dict of arrays
    ```

    and the sample is `{param_key: params, output_key: out}` (by default
    `{"theta": params, "x": out}`). When `sampler` (or `simulator`) returns a dict, its
    keys are used as they are instead of `param_key` (or `output_key`).

    `TrainingLoop` trains on samples `{"x": input, "y": target}`, and which of the two
    keys is the input depends on the task, so say it: an emulator learns parameters →
    outputs (`as_supervised(ds, input="theta", target="x")`, or build the dataset with
    `param_key="x", output_key="y"`); amortized inference learns observations →
    parameters (`as_supervised(ds, input="x", target="theta")`, or
    `param_key="y", output_key="x"`).

    **Stochastic simulators.** A simulator with a parameter named `rng`
    (`def simulate(params, rng): ...`) is called as `simulator(params, rng=sim_rng)`
    with its own generator for the item,
    `sim_rng = np.random.default_rng(simulator_seed(seed, i))`: the first child of the
    sampler's seed sequence, independent of the sampler's draws. The noise of item `i`
    then depends only on `(seed, i)`: the same in every process, worker and resumed
    run, whatever order items are read in. Never seed noise from `hash()`, time or a
    global generator.

    A simulation is *invalid* when the simulator raises an `Exception` or returns
    non-finite floats. `on_invalid` decides what happens:

    - `"raise"` (default): raise `SimulationError` naming the index and seed.
    - `"resample"`: retry with `np.random.default_rng([seed, i, attempt])` for
      `attempt = 1 .. max_attempts`; the first valid draw is item `i` (deterministic);
      if none is valid, raise `SimulationError`.
    - `"drop"`: the dataset holds only the valid items. On first use of `len()` or an
      index, every raw item is simulated once (a *scan*, `scan(workers=...)` runs it in
      parallel) and the indices of the valid ones are kept: item `j` is raw item
      `valid_indices[j]`. The scan costs one full pass; the mapping enters the
      fingerprint.

    `stats` counts events in this process (and in build workers whose counts are
    merged back): `"invalid"` invalid simulations seen, `"resampled"` items that
    needed at least one retry, `"dropped"` raw items dropped by the scan.

    Args:
        simulator: any callable or `Operator` mapping parameters to outputs; if it has a
            parameter named `rng` it also gets the item's generator (see above).
        sampler: a callable `sampler(rng) -> params` drawing parameters from a
            `np.random.Generator`.
        n: the number of raw items (>= 1).
        seed: a non-negative int.
        on_invalid: `"raise"`, `"resample"` or `"drop"`.
        param_key: the sample key of the parameters when `sampler` returns an array.
        output_key: the sample key of the output when `simulator` returns an array.
        max_attempts: retries per item under `"resample"`.

    Raises:
        ConfigError: an argument has an invalid value.
    """

    def __init__(
        self,
        simulator: Callable[..., Any],
        sampler: Callable[[np.random.Generator], Any],
        n: int,
        seed: int = 0,
        *,
        on_invalid: OnInvalid = "raise",
        param_key: str = "theta",
        output_key: str = "x",
        max_attempts: int = 10,
    ) -> None:
        if not callable(simulator):
            raise ConfigError(
                f"`simulator` must be callable (a function or an Operator). "
                f"Received: simulator={simulator!r}."
            )
        if not callable(sampler):
            raise ConfigError(
                "`sampler` must be a callable `sampler(rng) -> params`. "
                f"Received: sampler={sampler!r}."
            )
        self.n = _check_int("n", n, minimum=1, hint="Use the number of simulations, e.g. n=1000.")
        self.seed = _check_int("seed", seed, minimum=0, hint="Use e.g. seed=0.")
        if on_invalid not in _POLICIES:
            raise ConfigError(
                f"`on_invalid` must be one of {list(_POLICIES)}. Received: on_invalid={on_invalid!r}."
            )
        check_key(param_key, field="param_key")
        check_key(output_key, field="output_key")
        if param_key == output_key:
            raise ConfigError(
                "`param_key` and `output_key` must differ. "
                f"Received: param_key={param_key!r}, output_key={output_key!r}."
            )
        self.max_attempts = _check_int(
            "max_attempts", max_attempts, minimum=1, hint="Use e.g. max_attempts=10."
        )
        self.simulator = simulator
        self.sampler = sampler
        self.simulator_takes_rng = _takes_rng(simulator)
        self.on_invalid: OnInvalid = on_invalid
        self.param_key = param_key
        self.output_key = output_key
        self.stats: dict[str, int] = {"invalid": 0, "resampled": 0, "dropped": 0}
        self._valid: np.ndarray | None = None
        self._spec: dict[str, ArraySpec] | None = None
        self._fingerprint: str | None = None

    # -- one simulation ----------------------------------------------------------------
    def _simulate(self, raw: int, attempt: int) -> tuple[Sample | None, str, BaseException | None]:
        """Simulate raw item `raw` at `attempt`: (sample, "", None) or (None, why, exc)."""
        entropy = [self.seed, raw] if attempt == 0 else [self.seed, raw, attempt]
        params = self.sampler(np.random.default_rng(entropy))
        try:
            if self.simulator_takes_rng:
                rng = np.random.default_rng(simulator_seed(self.seed, raw, attempt))
                out = self.simulator(params, rng=rng)
            else:
                out = self.simulator(params)
        except Exception as exc:  # an invalid simulation; the policy decides
            return None, f"the simulator raised {type(exc).__name__}: {exc}", exc
        sample: dict[str, Any] = {}
        if isinstance(params, Mapping):
            sample.update(params)
        else:
            sample[self.param_key] = params
        out_items = dict(out) if isinstance(out, Mapping) else {self.output_key: out}
        for key, value in out_items.items():
            if key in sample:
                raise ConfigError(
                    f"The simulator output key {key!r} clashes with a parameter key. Received: "
                    f"parameter keys {sorted(sample)}. Use different `param_key`/`output_key`."
                )
            sample[key] = value
        checked = as_sample(sample, where=f"simulation item {raw}")
        for key in out_items:
            arr = checked[key]
            if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
                return None, f"the output {key!r} has non-finite values", None
        return checked, "", None

    def _error(self, raw: int, why: str, exc: BaseException | None, attempts: int = 1) -> None:
        tries = "" if attempts == 1 else f" in all {attempts} attempts"
        sim_rng = (
            f", simulator rng=np.random.default_rng(simulator_seed({self.seed}, {raw}))"
            if self.simulator_takes_rng
            else ""
        )
        err = SimulationError(
            f"Simulation of item {raw} (seed={self.seed}, rng=np.random.default_rng("
            f"[{self.seed}, {raw}]){sim_rng}) was invalid{tries}: {why}. Fix the simulator, or pass "
            "on_invalid='resample' or on_invalid='drop' to SimulationDataset."
        )
        raise err from exc

    def _item(self, raw: int) -> Sample:
        sample, why, exc = self._simulate(raw, 0)
        if sample is not None:
            return sample
        self.stats["invalid"] += 1
        if self.on_invalid == "resample":
            for attempt in range(1, self.max_attempts + 1):
                sample, why, exc = self._simulate(raw, attempt)
                if sample is not None:
                    self.stats["resampled"] += 1
                    return sample
                self.stats["invalid"] += 1
            self._error(raw, why, exc, attempts=self.max_attempts + 1)
        self._error(raw, why, exc)
        raise AssertionError("unreachable")

    # -- the drop policy ---------------------------------------------------------------
    def _validity(self, start: int, stop: int) -> np.ndarray:
        valid = np.zeros(stop - start, dtype=bool)
        for raw in range(start, stop):
            sample, _, _ = self._simulate(raw, 0)
            valid[raw - start] = sample is not None
            if sample is None:
                self.stats["invalid"] += 1
        return valid

    def scan(self, *, workers: int = 0, mp_context: str = "spawn", pool: Any = None) -> int:
        """Simulate every raw item once and keep the valid ones (`on_invalid="drop"` only).

        Runs automatically on first `len()` or index; call it explicitly to run it in
        `workers` processes (or in `pool`, a process pool from a cache build). Does
        nothing when already scanned.

        Returns:
            The number of valid items.
        """
        if self.on_invalid != "drop":
            return self.n
        if self._valid is None:
            workers = check_workers(self, workers, mp_context)
            size = max(1, -(-self.n // max(1, 4 * workers)))
            blocks = [(s, min(self.n, s + size)) for s in range(0, self.n, size)]
            parts = []
            for valid, delta in compute_blocks(
                self, "validity", blocks, workers=workers, mp_context=mp_context, pool=pool
            ):
                parts.append(valid)
                if workers and delta:
                    self._add_stats(delta)
            valid_all = np.concatenate(parts)
            self._valid = np.flatnonzero(valid_all).astype(np.int64)
            self.stats["dropped"] = int(self.n - self._valid.size)
            if self._valid.size == 0:
                raise SimulationError(
                    f"Every one of the {self.n} simulations was invalid (seed={self.seed}), so "
                    "on_invalid='drop' leaves an empty dataset. Fix the simulator or the sampler."
                )
        return int(self._valid.size)

    @property
    def valid_indices(self) -> np.ndarray | None:
        """Raw indices of the kept items (`"drop"` after the scan), else None."""
        return None if self._valid is None else self._valid.copy()

    def _add_stats(self, delta: Mapping[str, int]) -> None:
        for key, value in delta.items():
            if key != "dropped":
                self.stats[key] = self.stats.get(key, 0) + int(value)

    # -- the dataset protocol ----------------------------------------------------------
    def __len__(self) -> int:
        return self.scan() if self.on_invalid == "drop" else self.n

    def _raw_index(self, index: int) -> int:
        length = len(self)
        i = int(index)
        if not -length <= i < length:
            raise IndexError(f"index {index} is out of range for a dataset of {length}")
        i %= length
        return int(self._valid[i]) if self._valid is not None else i

    def _raw_item(self, raw: int) -> Sample:
        if self.on_invalid == "drop":
            sample, why, exc = self._simulate(raw, 0)
            if sample is None:  # valid during the scan: the simulator is not deterministic
                self.stats["invalid"] += 1
                self._error(
                    raw,
                    why + " (it was valid during the scan: is the simulator "
                    "deterministic given its parameters?)",
                    exc,
                )
            return sample  # type: ignore[return-value]  # `_error` raised if it is None
        return self._item(raw)

    def _raw_batch(self, raw: np.ndarray) -> Batch:
        """The batch of raw items `raw` (no index mapping; used by build workers)."""
        samples = [self._raw_item(int(r)) for r in raw]
        spec = self._spec if self._spec is not None else spec_of(samples[0])
        return stack_samples(samples, spec)

    def __getitem__(self, index: int) -> Sample:
        return self._raw_item(self._raw_index(index))

    def get_batch(self, indices: np.ndarray) -> Batch:
        """Simulate the items at `indices` and stack them into a batch."""
        spec = self.element_spec
        return stack_samples([self[int(i)] for i in np.asarray(indices)], spec)

    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        """Shape and dtype per key, from item 0."""
        if self._spec is None:
            self._spec = spec_of(self[0])
        return dict(self._spec)

    @property
    def keys(self) -> tuple[str, ...]:
        """The sample keys."""
        return tuple(self.element_spec)

    def fingerprint(self) -> str:
        """SHA-256 of the configuration, the simulator/sampler names and a content probe.

        The probe hashes the first and last items, so a changed simulator body is
        detected even when its name is unchanged; under `"drop"` the valid-index mapping
        is hashed too (this runs the scan).
        """
        if self._fingerprint is None:
            h = Hasher("SimulationDataset")
            config: dict[str, Any] = {
                "n": self.n,
                "seed": self.seed,
                "on_invalid": self.on_invalid,
                "param_key": self.param_key,
                "output_key": self.output_key,
                "max_attempts": self.max_attempts,
                "simulator": fingerprint_callable(self.simulator),
                "sampler": fingerprint_callable(self.sampler),
            }
            if self.simulator_takes_rng:  # only then: older fingerprints stay valid
                config["simulator_rng"] = "SeedSequence([seed, i], spawn_key=(0,))"
            h.update_json(config)
            length = len(self)
            if self._valid is not None:
                h.update_array(self._valid)
            for i in sorted({0, length - 1}):
                h.update_sample(self[i])
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def __repr__(self) -> str:
        return (
            f"SimulationDataset({fingerprint_callable(self.simulator)!r}, n={self.n}, "
            f"seed={self.seed}, on_invalid={self.on_invalid!r})"
        )
