"""The checkpoint engine of an Equinox run: core's `Checkpointer` protocol on Orbax.

`checkpointer(policy, names, copy)` builds the run's engine, an `OrbaxCheckpointer`
writing the step backend's `FlatState` as `{leaf name: array}`.

Layout: `<directory>/<step>/{state, meta, pipekit}` written atomically by Orbax as one
`Composite` — `state` the train state's arrays (`StandardSave`), `meta` the JSON core
hands over (run state, data-iterator state, plan), `pipekit` this package's record
(monitored score, leaf names). An interrupted save leaves only
`<step>.orbax-checkpoint-tmp-*`, which restore ignores and the next save cleans up.

Saving, in one process (the usual case): the training thread only copies the state's
arrays into host buffers reused from one save to the next (shard by shard, so a sharded
array is copied once); a writer thread of ours puts them back on their devices (same
shardings), has Orbax write the step synchronously, then seals it. With several
processes (`jax.distributed`), Orbax's save takes part in collectives and must stay on
the training thread: each save then takes fresh device copies (`to_tree`) and Orbax
writes them in the background (its async mode), and our thread seals the step once
Orbax has committed it.

Sealing: once Orbax has committed a step, a background thread of ours (on the primary
process only) hashes every file of `<step>/` and writes `<step>/pipekit-digest.json`
atomically (core's `seal_folder`). The training thread only waits for it at the next save, at
`wait()` and at `close()`, as it already waited for Orbax's own commit.

Where steps live is core's `CheckpointStore` (chosen once from the policy): Orbax writes
into the store's `engine_root()` and the store commits the step (`commit_folder`: seal,
and at a URI upload every file with `pipekit-digest.json` last). On a local folder the
engine root is the checkpoint folder itself (Orbax renames each step into place); at a
URI (Orbax 0.12's TensorStore maps only `gs://`, and `epath` cannot take fsspec
`storage_options`) it is a staging folder under the system temporary directory.
Retention (`max_to_keep` latest plus `keep_best` best, after each commit) and the
torn-step fallback are the store's.

Restore walks the committed steps newest first (the store's `restore_latest`) with a
fresh manager per attempt (a manager that failed a restore is unusable). A step is
torn, and skipped with a `TornCheckpointWarning` naming the step and the file, when it
has no digest (the run stopped before it was sealed), when a file does not match its
digest (or is missing, or was added), or when its files cannot be read. Nothing is
read from a step before its digest is checked (`CheckpointStore.checked_folder`).

A write that fails (disk full, permission denied, a dropped connection) closes the
Orbax manager, removes the partial step and raises one `CheckpointError` (from a
background save: at the next `poll()`, `save()`, `wait()` or `close()`). Every process checks the steps itself (they read the same files, so
they agree); a barrier first makes sure the primary has finished sealing. A step whose
arrays do not match the model (other shapes, dtypes or leaves) is not torn: that raises
`CheckpointError`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from pipekit_train.core.adapter import (
    Checkpoint,
    CheckpointError,
    ConfigError,
    HostBuffers,
    Restored,
    TornStepError,
    open_store,
)

from ._state import FlatState

__all__ = ["OrbaxCheckpointer", "abstract_of", "checkpointer"]

_FORMAT = 1
_RECORD = "pipekit/metadata"


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
        policy: the checkpoint policy (directory or URI, interval handled by core,
            retention, `async_save`).
        to_tree: `state -> {name: jax.Array}`: fresh arrays (not aliases of the live
            state: the train step donates its input buffers). Used with several
            processes, or when `live_tree` is not given.
        template_tree: `template -> {name: jax.ShapeDtypeStruct}` with shardings, for a
            sharding-aware restore.
        from_tree: `({name: jax.Array}, template) -> state`.
        fix_meta: applied to the restored meta (e.g. per-process data shards).
        live_tree: `state -> {name: jax.Array}` without copies. In one process the
            training thread copies these into reused host buffers and everything else
            runs on the writer thread.

    Raises:
        ConfigError: a location that only one process may write (a URI) in a
            multi-process run, or without `live_tree`.

    Attributes:
        collective: True: Orbax's save is a collective operation, so core's
            `RunLifecycle` calls `save` on every process of a multi-process run (each
            writes its own shards; the primary writes the metadata and seals the step).
    """

    collective: ClassVar[bool] = True

    def __init__(
        self,
        policy: Checkpoint,
        *,
        to_tree: Callable[[Any], dict[str, Any]],
        template_tree: Callable[[Any], dict[str, Any]],
        from_tree: Callable[[Mapping[str, Any], Any], Any],
        fix_meta: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        live_tree: Callable[[Any], dict[str, Any]] | None = None,
    ):
        self.policy = policy
        self._host = live_tree is not None and jax.process_count() == 1
        self.store = open_store(policy)
        if not self.store.shared_writes and not self._host:
            raise ConfigError(
                "Equinox checkpoints at a URI are written by one process; this run has "
                f"{jax.process_count()} processes. Received: directory={policy.location!r}. "
                "Use a shared local folder (e.g. a network file system) for multi-process runs."
            )
        self._to_tree = to_tree
        self._live_tree = live_tree
        self._template_tree = template_tree
        self._from_tree = from_tree
        self._fix_meta = fix_meta or (lambda meta: meta)
        self._manager: ocp.CheckpointManager | None = None
        self._buffers = HostBuffers()
        self._writer_pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._sealer: ThreadPoolExecutor | None = None
        self._sealing: Future[None] | None = None
        self._last_step = 0

    @property
    def root(self) -> Path:
        """The local folder Orbax writes step folders into (the store's engine root)."""
        return self.store.engine_root()

    # -- managers ----------------------------------------------------------------------
    def _options(self, *, create: bool) -> ocp.CheckpointManagerOptions:
        return ocp.CheckpointManagerOptions(
            max_to_keep=None,
            create=create,
            # In one process our own writer thread makes the save asynchronous.
            enable_async_checkpointing=bool(self.policy.async_save) and not self._host,
            cleanup_tmp_directories=create,
        )

    def _writer(self) -> ocp.CheckpointManager:
        if self._manager is None:
            self._manager = ocp.CheckpointManager(
                self.root, options=self._options(create=True), item_handlers=_handlers()
            )
        return self._manager

    def _fresh(self, root: Path) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(
            root, options=self._options(create=False), item_handlers=_handlers()
        )

    def _abandon(self) -> None:
        """Close the manager after a failed write (a fresh one is made for the next save)."""
        manager, self._manager = self._manager, None
        if manager is not None:
            with contextlib.suppress(Exception):
                manager.close()

    def _failed(self, step: int, exc: BaseException) -> CheckpointError:
        self._abandon()
        # Finalize Orbax's orphaned coroutines now, not at interpreter shutdown (where
        # their cleanup fails with `ImportError: sys.meta_path is None`).
        gc.collect()
        if isinstance(exc, CheckpointError):
            return exc
        return self.store.write_failed(step, exc)

    # -- saving ------------------------------------------------------------------------
    def save(
        self, step: int, state: Any, meta: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> str:
        """Start saving `state` + `meta` for `step` (in the background when `async_save`).

        Raises:
            CheckpointError: the write failed (synchronous save), or the previous
                background one did.
        """
        if not self._host:
            return self._save_on_device(step, state, meta, metrics)
        self._wait_pending()
        assert self._live_tree is not None
        snapshot = self._snapshot(self._live_tree(state))
        score = metrics.get(self.policy.monitor) if metrics else None
        score = None if score is None else float(score)
        record = {"format": _FORMAT, "step": int(step), "score": score, "leaves": sorted(snapshot)}
        meta_json = json.loads(json.dumps(dict(meta), default=repr))
        job = functools.partial(self._commit, int(step), snapshot, meta_json, record)
        if self.policy.async_save:
            if self._writer_pool is None:
                self._writer_pool = ThreadPoolExecutor(1, thread_name_prefix="pipekit-orbax-writer")
            self._pending = self._writer_pool.submit(job)
        else:
            job()
        return self.store.step_location(int(step))

    def _snapshot(self, tree: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Training thread: copy each array into its reused host buffer (shard by shard).

        A leaf numpy cannot hold (a typed PRNG key) gets a fresh device copy instead.
        """
        out: dict[str, tuple[Any, Any]] = {}
        for name, leaf in tree.items():
            if not isinstance(leaf, jax.Array):
                out[name] = (self._buffers.copy(name, leaf), None)
                continue
            if jax.numpy.issubdtype(leaf.dtype, jax.dtypes.extended):
                out[name] = (leaf.copy(), leaf.sharding)
                continue
            buf = self._buffers.buffer(name, leaf.shape, leaf.dtype)
            if len(leaf.sharding.device_set) == 1:
                np.copyto(buf, np.asarray(leaf), casting="no")  # a view on CPU: one copy
            else:
                for shard in leaf.addressable_shards:
                    if shard.replica_id == 0:  # `...`: a view even of a 0-d buffer
                        target = buf[(*shard.index, Ellipsis)]
                        np.copyto(target, np.asarray(shard.data), casting="no")
            out[name] = (buf, leaf.sharding)
        return out

    def _commit(
        self,
        step: int,
        snapshot: Mapping[str, tuple[Any, Any]],
        meta: dict[str, Any],
        record: dict[str, Any],
    ) -> None:
        """Writer thread (or inline): Orbax writes the step, the store commits and prunes."""
        try:
            manager = self._writer()
            self._drop_stale(manager, step)
            self.store.reserve(step, self._space_needed(snapshot))
            tree = {
                name: jax.device_put(buf, sharding, may_alias=False)
                for name, (buf, sharding) in snapshot.items()
            }
            manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(tree),
                    meta=ocp.args.JsonSave(meta),
                    pipekit=ocp.args.JsonSave(record),
                ),
                force=True,
            )
            manager.wait_until_finished()
            del tree
            self.store.commit_folder(step, self.root / str(step), record["score"])
        except Exception as exc:
            raise self._failed(step, exc) from exc
        self._retain(manager, step)

    def _space_needed(self, snapshot: Mapping[str, tuple[Any, Any]]) -> int:
        """Bytes to have free before Orbax writes a step: the last step's size (or the
        arrays' on the first save), with room for Orbax's temporary files.

        A write that runs out of space inside Orbax fails noisily (its background threads
        log each failure); one that cannot fit is refused before it starts.
        """
        arrays = sum(int(getattr(buf, "nbytes", 0)) for buf, _ in snapshot.values())
        last = self.store.last_folder_bytes or 0
        return int(max(arrays, last) * 1.25) + (64 << 10)

    def _retain(self, manager: ocp.CheckpointManager, step: int) -> None:
        """Retention after the commit of `step`; a failure there keeps `step`."""
        try:
            self._prune(manager)
        except CheckpointError:  # a `LeaseError`: this run lost the location
            self._abandon()
            raise
        except Exception as exc:
            self._abandon()
            raise CheckpointError(
                f"The checkpoint of step {step} was written to {self.store.step_location(step)}, "
                f"but deleting older checkpoints failed ({type(exc).__name__}: {exc})."
            ) from exc

    def _drop_stale(self, manager: ocp.CheckpointManager, step: int) -> None:
        """Delete steps from an abandoned timeline (torn steps a restore fell back past)."""
        _primary_then_reload(manager, lambda: self.store.drop_from(step), "drop")

    def _save_on_device(
        self, step: int, state: Any, meta: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> str:
        """Several processes: fresh device copies, Orbax's async save, our sealer thread."""
        self._wait_sealed()
        try:
            manager = self._writer()
            manager.wait_until_finished()
        except Exception as exc:
            raise self._failed(self._last_step, exc) from exc
        self._retain(manager, self._last_step)
        self._last_step = int(step)
        try:
            self._drop_stale(manager, step)
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
        except Exception as exc:
            raise self._failed(step, exc) from exc
        if not self.policy.async_save:
            manager.wait_until_finished()
        if jax.process_index() == 0:
            if self._sealer is None:
                self._sealer = ThreadPoolExecutor(1, thread_name_prefix="pipekit-orbax-seal")
            self._sealing = self._sealer.submit(self._seal, manager, int(step), score)
            if not self.policy.async_save:
                self._wait_sealed()
        return self.store.step_location(int(step))

    def _seal(self, manager: ocp.CheckpointManager, step: int, score: float | None) -> None:
        """Background: wait for Orbax to commit `step`, then have the store commit it."""
        try:
            manager.wait_until_finished()  # joins Orbax's finalize thread; safe from any thread
            folder = self.root / str(step)
            if folder.is_dir():  # else retention already removed it
                self.store.commit_folder(step, folder, score)
        except Exception as exc:
            if isinstance(exc, CheckpointError):
                raise
            raise self.store.write_failed(step, exc) from exc

    def _wait_sealed(self) -> None:
        """Block until the pending digest is written; re-raise a failed save's error."""
        pending, self._sealing = self._sealing, None
        if pending is not None:
            pending.result()

    def _wait_pending(self) -> None:
        """Block until the pending background commit is done; re-raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _score_of(self, step: int) -> float | None:
        return json.loads(self.store.read(step, _RECORD)).get("score")

    def _prune(self, manager: ocp.CheckpointManager) -> None:
        """Retention (the store's), on the primary process; the manager re-reads its steps."""
        _primary_then_reload(manager, lambda: self.store.prune(self._score_of), "retention")

    def poll(self) -> None:
        """Raise the error of a failed background save, if any; never blocks."""
        for name in ("_pending", "_sealing"):
            pending = getattr(self, name)
            if pending is not None and pending.done():
                setattr(self, name, None)
                pending.result()

    def wait(self) -> None:
        """Block until the pending save is committed, then apply retention."""
        self._wait_pending()
        self._wait_sealed()
        if self._manager is not None and not self._host:
            try:
                self._manager.wait_until_finished()
            except Exception as exc:
                raise self._failed(self._last_step, exc) from exc
            self._retain(self._manager, self._last_step)

    def close(self) -> None:
        """Wait for pending saves and release the manager (and any staging folder)."""
        try:
            self.wait()
        finally:
            self._abandon()
            for pool in (self._writer_pool, self._sealer):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._writer_pool = self._sealer = None
            self.store.close()

    # -- restoring ---------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Step folders (sealed or not), ascending."""
        return self.store.steps()

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
                f"The checkpoint at {self.store.step_location(step)} holds a different model state ({detail}). "
                "Use the model, optimizer and precision it was written with, or a new checkpoint directory."
            )

    def restore_latest(self, template: Any) -> Restored | None:
        """Restore the newest readable step into `template`'s structure and shardings."""
        self.wait()
        if jax.process_count() > 1:
            # The primary seals in the background: let it finish before anyone checks.
            multihost_utils.sync_global_devices("pipekit_train.equinox:restore")
        abstract = self._template_tree(template)

        def load(step: int) -> Restored:
            with self.store.checked_folder(step) as folder:
                return self._restore_step(folder.parent, step, abstract, template)

        return self.store.restore_latest(load, stacklevel=2)

    def restore_step(self, step: int, template: Any) -> Restored | None:
        """Restore step `step` (e.g. the best one) into `template`'s structure and
        shardings, or None, with a warning, when it is missing, torn or void."""
        self.wait()
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("pipekit_train.equinox:restore_step")
        abstract = self._template_tree(template)

        def load(at: int) -> Restored:
            with self.store.checked_folder(at) as folder:
                return self._restore_step(folder.parent, at, abstract, template)

        return self.store.restore_step(step, load, stacklevel=2)

    def _restore_step(
        self, root: Path, step: int, abstract: Mapping[str, Any], template: Any
    ) -> Restored:
        """Restore one step that passed its digest check (`TornStepError` if Orbax fails)."""
        manager = self._fresh(root)
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
        except Exception as exc:  # Orbax raises ValueError, FileNotFoundError, bare Exception...
            first = (
                str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            )
            raise TornStepError(f"{type(exc).__name__}: {first}") from exc
        finally:
            manager.close()
        return Restored(step=step, state=state, meta=meta, path=self.store.step_location(step))


def _primary_then_reload(manager: ocp.CheckpointManager, change: Any, what: str) -> None:
    """Run `change` (deleting step folders) on the primary process only; every process
    re-reads its steps after it. With several processes they meet at a barrier first, so
    no process lists a folder while the primary deletes it (the barrier is reached even
    when `change` fails, so the other processes never wait for ever)."""
    try:
        if jax.process_index() == 0:
            change()
    finally:
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"pipekit_train.equinox:{what}")
    manager.reload()


def abstract_of(tree: Mapping[str, Any]) -> dict[str, jax.ShapeDtypeStruct]:
    """`ShapeDtypeStruct`s (with shardings) of a dict of arrays: a restore template."""
    return {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=getattr(v, "sharding", None))
        for k, v in tree.items()
    }


def checkpointer(
    policy: Checkpoint, names: Sequence[str], copy: Callable[[list[Any]], list[Any]]
) -> OrbaxCheckpointer:
    """The run's checkpoint engine: Orbax, writing a `FlatState` as `{name: array}`.

    Args:
        policy: the run's checkpoint policy.
        names: the stable checkpoint name of each array of the state, in order.
        copy: fresh device copies of the state's arrays (the train step donates its
            input buffers), for multi-process saves.
    """
    names = list(names)

    def to_tree(state: FlatState) -> dict[str, Any]:
        return dict(zip(names, copy(state.leaves), strict=True))

    def live_tree(state: FlatState) -> dict[str, Any]:
        return dict(zip(names, state.leaves, strict=True))

    def template_tree(template: FlatState) -> dict[str, Any]:
        return abstract_of(dict(zip(names, template.leaves, strict=True)))

    def from_tree(tree: Mapping[str, Any], template: FlatState) -> FlatState:
        return FlatState([tree[name] for name in names])

    return OrbaxCheckpointer(
        policy,
        to_tree=to_tree,
        template_tree=template_tree,
        from_tree=from_tree,
        live_tree=live_tree,
    )
