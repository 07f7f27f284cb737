"""`OrbaxCheckpointer`: core's `Checkpointer` protocol on an Orbax `CheckpointManager`.

Layout: `<directory>/<step>/{state, meta, pipekit}` written atomically by Orbax as one
`Composite` — `state` the train state's arrays (`StandardSave`), `meta` the JSON core
hands over (run state, data-iterator state, plan), `pipekit` this package's record
(monitored score, leaf names). An interrupted save leaves only
`<step>.orbax-checkpoint-tmp-*`, which restore ignores and the next save cleans up.

Sealing: once Orbax has committed a step, a background thread of ours (on the primary
process only) hashes every file of `<step>/` and writes `<step>/pipekit-digest.json`
atomically (`_digest.seal`). The training thread only waits for it at the next save, at
`wait()` and at `close()`, as it already waited for Orbax's own commit.

Retention is core's `Checkpoint.retained` (the `max_to_keep` latest plus the `keep_best`
best by `monitor`), applied by deleting steps after each save has committed (never
before: a crash mid-save keeps the previous checkpoints).

Restore walks the committed steps newest first with a fresh manager per attempt (a
manager that failed a restore is unusable). A step is torn, and skipped with a
`TornCheckpointWarning` naming the step and the file, when it has no digest (the run
stopped before it was sealed), when a file does not match its digest (or is missing, or
was added), or when its files cannot be read. Nothing is read from a step before its
digest is checked. Every process checks the steps itself (they read the same files, so
they agree); a barrier first makes sure the primary has finished sealing. A step whose
arrays do not match the model (other shapes, dtypes or leaves) is not torn: that raises
`CheckpointError`.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from pipekit_train.core import Checkpoint, CheckpointError, TornCheckpointWarning
from pipekit_train.core.adapter import Restored

from . import _digest

__all__ = ["OrbaxCheckpointer", "abstract_of"]

_FORMAT = 1


def _handlers() -> dict[str, Any]:
    return {
        "state": ocp.StandardCheckpointHandler(),
        "meta": ocp.JsonCheckpointHandler(),
        "pipekit": ocp.JsonCheckpointHandler(),
    }


class _Quiet:
    """Silence absl/orbax log records below ERROR while probing damaged steps."""

    def __enter__(self) -> None:
        self._logger = logging.getLogger("absl")
        self._level = self._logger.level
        self._logger.setLevel(logging.CRITICAL)

    def __exit__(self, *exc: Any) -> None:
        self._logger.setLevel(self._level)


class OrbaxCheckpointer:
    """Save and restore a training state with Orbax, per a core `Checkpoint` policy.

    Args:
        policy: the checkpoint policy (directory, interval handled by core, retention,
            `async_save`).
        to_tree: `state -> {name: jax.Array}`: fresh arrays (not aliases of the live
            state: the train step donates its input buffers).
        template_tree: `template -> {name: jax.ShapeDtypeStruct}` with shardings, for a
            sharding-aware restore.
        from_tree: `({name: jax.Array}, template) -> state`.
        fix_meta: applied to the restored meta (e.g. per-process data shards).
    """

    def __init__(
        self,
        policy: Checkpoint,
        *,
        to_tree: Callable[[Any], dict[str, Any]],
        template_tree: Callable[[Any], dict[str, Any]],
        from_tree: Callable[[Mapping[str, Any], Any], Any],
        fix_meta: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ):
        self.policy = policy
        self.root = policy.path
        self._to_tree = to_tree
        self._template_tree = template_tree
        self._from_tree = from_tree
        self._fix_meta = fix_meta or (lambda meta: meta)
        self._manager: ocp.CheckpointManager | None = None
        self._scores: dict[int, float | None] = {}
        self._sealer: ThreadPoolExecutor | None = None
        self._sealing: Future[None] | None = None

    # -- managers ----------------------------------------------------------------------
    def _options(self, *, create: bool) -> ocp.CheckpointManagerOptions:
        return ocp.CheckpointManagerOptions(
            max_to_keep=None,
            create=create,
            enable_async_checkpointing=bool(self.policy.async_save),
            cleanup_tmp_directories=create,
        )

    def _writer(self) -> ocp.CheckpointManager:
        if self._manager is None:
            self._manager = ocp.CheckpointManager(
                self.root, options=self._options(create=True), item_handlers=_handlers()
            )
        return self._manager

    def _fresh(self) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(
            self.root, options=self._options(create=False), item_handlers=_handlers()
        )

    # -- saving ------------------------------------------------------------------------
    def save(
        self, step: int, state: Any, meta: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> str:
        """Start saving `state` + `meta` for `step` (in the background when `async_save`)."""
        manager = self._writer()
        self._wait_sealed()
        manager.wait_until_finished()
        self._prune(manager)
        for stale in [s for s in manager.all_steps() if s >= step]:
            # Steps from an abandoned timeline (torn steps a restore fell back past).
            manager.delete(stale)
            self._scores.pop(stale, None)
        tree = self._to_tree(state)
        score = metrics.get(self.policy.monitor) if metrics else None
        score = None if score is None else float(score)
        record = {"format": _FORMAT, "step": int(step), "score": score, "leaves": sorted(tree)}
        manager.save(
            int(step),
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(tree),
                meta=ocp.args.JsonSave(json.loads(json.dumps(dict(meta), default=repr))),
                pipekit=ocp.args.JsonSave(record),
            ),
            force=True,
        )
        self._scores[int(step)] = score
        if not self.policy.async_save:
            self._prune(manager)
        if jax.process_index() == 0:
            if self._sealer is None:
                self._sealer = ThreadPoolExecutor(1, thread_name_prefix="pipekit-orbax-seal")
            self._sealing = self._sealer.submit(self._seal, manager, int(step))
        return str(self.root / str(int(step)))

    def _seal(self, manager: ocp.CheckpointManager, step: int) -> None:
        """Background: wait for Orbax to commit `step`, then write its digest."""
        manager.wait_until_finished()  # joins Orbax's finalize thread; safe from any thread
        folder = self.root / str(step)
        if folder.is_dir():  # else retention already removed it
            _digest.seal(folder, step)

    def _wait_sealed(self) -> None:
        """Block until the pending digest is written; re-raise a failed save's error."""
        pending, self._sealing = self._sealing, None
        if pending is not None:
            pending.result()

    def _score_of(self, step: int) -> float | None:
        if step not in self._scores:
            try:
                record = json.loads((self.root / str(step) / "pipekit" / "metadata").read_text())
                self._scores[step] = record.get("score")
            except (OSError, ValueError, AttributeError):
                self._scores[step] = None
        return self._scores[step]

    def _prune(self, manager: ocp.CheckpointManager) -> None:
        steps = list(manager.all_steps())
        if not steps:
            return
        scores = {s: self._score_of(s) for s in steps} if self.policy.keep_best else {}
        keep = self.policy.retained(steps, scores)
        for s in steps:
            if s not in keep:
                manager.delete(s)
                self._scores.pop(s, None)

    def wait(self) -> None:
        """Block until the pending save is committed, then apply retention."""
        self._wait_sealed()
        if self._manager is not None:
            self._manager.wait_until_finished()
            self._prune(self._manager)

    def close(self) -> None:
        """Wait for pending saves and release the manager."""
        try:
            self.wait()
        finally:
            if self._manager is not None:
                self._manager.close()
                self._manager = None
            if self._sealer is not None:
                self._sealer.shutdown(wait=True)
                self._sealer = None

    # -- restoring ---------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Committed steps, ascending."""
        if not self.root.is_dir():
            return []
        manager = self._fresh()
        try:
            return sorted(int(s) for s in manager.all_steps())
        finally:
            manager.close()

    def _check_layout(
        self, manager: ocp.CheckpointManager, step: int, abstract: Mapping[str, Any]
    ) -> None:
        """Raise `CheckpointError` if the saved arrays are not the model's."""
        metadata = manager.item_metadata(step)["state"]
        tree = getattr(metadata, "tree", metadata)
        if tree is None:
            raise ValueError("the state metadata is unreadable")
        saved = {k: (tuple(v.shape), str(v.dtype)) for k, v in dict(tree).items()}
        wanted = {k: (tuple(v.shape), str(v.dtype)) for k, v in abstract.items()}
        if saved != wanted:
            diff = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))[:5]
            detail = "; ".join(
                f"{k}: checkpoint={saved.get(k)}, model={wanted.get(k)}" for k in diff
            )
            raise CheckpointError(
                f"The checkpoint at {self.root / str(step)} holds a different model state ({detail}). "
                "Use the model, optimizer and precision it was written with, or a new checkpoint directory."
            )

    def restore_latest(self, template: Any) -> Restored | None:
        """Restore the newest readable step into `template`'s structure and shardings."""
        self.wait()
        if jax.process_count() > 1:
            # The primary seals in the background: let it finish before anyone checks.
            multihost_utils.sync_global_devices("pipekit_train.equinox:restore")
        abstract = self._template_tree(template)
        for step in reversed(self.steps()):
            problem = _digest.check(self.root / str(step))
            if problem is not None:
                warnings.warn(
                    f"Skipping torn checkpoint at {self.root / str(step)} (step {step}): "
                    f"{problem}. Falling back to the previous checkpoint.",
                    TornCheckpointWarning,
                    stacklevel=2,
                )
                continue
            manager = self._fresh()
            try:
                with _Quiet():
                    self._check_layout(manager, step, abstract)
                    out = manager.restore(
                        step,
                        args=ocp.args.Composite(
                            state=ocp.args.StandardRestore(abstract),
                            meta=ocp.args.JsonRestore(),
                        ),
                    )
                    state = self._from_tree(out["state"], template)
                    meta = self._fix_meta(dict(out["meta"]))
            except CheckpointError:
                raise
            except (
                Exception
            ) as exc:  # Orbax raises ValueError, FileNotFoundError, bare Exception...
                first = (
                    str(exc).strip().splitlines()[0][:200]
                    if str(exc).strip()
                    else type(exc).__name__
                )
                warnings.warn(
                    f"Skipping torn checkpoint at {self.root / str(step)}: {type(exc).__name__}: {first}. "
                    "Falling back to the previous checkpoint.",
                    TornCheckpointWarning,
                    stacklevel=2,
                )
                continue
            finally:
                manager.close()
            return Restored(step=step, state=state, meta=meta, path=str(self.root / str(step)))
        return None


def abstract_of(tree: Mapping[str, Any]) -> dict[str, jax.ShapeDtypeStruct]:
    """`ShapeDtypeStruct`s (with shardings) of a dict of arrays: a restore template."""
    return {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=getattr(v, "sharding", None))
        for k, v in tree.items()
    }
