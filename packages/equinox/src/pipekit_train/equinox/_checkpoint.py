"""`OrbaxCheckpointer`: core's `Checkpointer` protocol on an Orbax `CheckpointManager`.

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

Cloud locations (`s3://`, `gs://`, `memory://`, any fsspec URI; one process only):
Orbax 0.12's array writer (TensorStore) maps only `gs://` to a remote store (an `s3://`
path fails with "Checkpoint path should be absolute"), and its `epath` paths cannot take
fsspec `storage_options` (a custom endpoint or credentials). So Orbax writes each step
into a local staging folder (under the system temporary directory), our writer thread
seals it there and uploads it through fsspec: every file first, `pipekit-digest.json`
last, as the step's commit marker (object stores have no atomic rename). Restore
downloads a step into staging, checks it against its digest, and only then lets Orbax
read it. Retention deletes a remote step marker first, so a half-deleted step is torn.

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

import functools
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from pipekit_train.core import Checkpoint, CheckpointError, ConfigError, TornCheckpointWarning
from pipekit_train.core.adapter import (
    FOLDER_DIGEST,
    HostBuffers,
    RemoteSteps,
    Restored,
    check_folder,
    seal_folder,
)

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
        ConfigError: a URI location in a multi-process run, or without `live_tree`.
    """

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
        if policy.is_remote and not self._host:
            raise ConfigError(
                "Equinox checkpoints at a URI are written by one process; this run has "
                f"{jax.process_count()} processes. Received: directory={policy.location!r}. "
                "Use a shared local folder (e.g. a network file system) for multi-process runs."
            )
        self.remote = RemoteSteps(policy) if policy.is_remote else None
        self._staging: Path | None = None
        if self.remote is not None:
            self._staging = Path(tempfile.mkdtemp(prefix="pipekit-orbax-staging-"))
            self.root = self._staging / "write"
        else:
            self.root = policy.path
        self._to_tree = to_tree
        self._live_tree = live_tree
        self._template_tree = template_tree
        self._from_tree = from_tree
        self._fix_meta = fix_meta or (lambda meta: meta)
        self._manager: ocp.CheckpointManager | None = None
        self._scores: dict[int, float | None] = {}
        self._buffers = HostBuffers()
        self._writer_pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._sealer: ThreadPoolExecutor | None = None
        self._sealing: Future[None] | None = None

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

    def _fresh(self, root: Path | None = None) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(
            self.root if root is None else root,
            options=self._options(create=False),
            item_handlers=_handlers(),
        )

    def _step_location(self, step: int) -> str:
        if self.remote is not None:
            return self.remote.uri(step)
        return str(self.root / str(int(step)))

    # -- saving ------------------------------------------------------------------------
    def save(
        self, step: int, state: Any, meta: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> str:
        """Start saving `state` + `meta` for `step` (in the background when `async_save`)."""
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
        return self._step_location(int(step))

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
        """Writer thread (or inline): Orbax writes the step, we seal, upload and prune."""
        manager = self._writer()
        self._drop_stale(manager, step)
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
        self._scores[step] = record["score"]
        folder = self.root / str(step)
        seal_folder(folder, step)
        if self.remote is not None:
            self.remote.upload(step, folder, marker=FOLDER_DIGEST)
            manager.delete(step)  # the staged copy is no longer needed
        self._prune(manager)

    def _drop_stale(self, manager: ocp.CheckpointManager, step: int) -> None:
        """Delete steps from an abandoned timeline (torn steps a restore fell back past)."""
        for stale in [s for s in manager.all_steps() if s >= step]:
            manager.delete(stale)
            self._scores.pop(stale, None)
        if self.remote is not None:
            for stale in [s for s in self.remote.steps() if s >= step]:
                self.remote.clear(stale, marker=FOLDER_DIGEST)
                self._scores.pop(stale, None)

    def _save_on_device(
        self, step: int, state: Any, meta: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> str:
        """Several processes: fresh device copies, Orbax's async save, our sealer thread."""
        manager = self._writer()
        self._wait_sealed()
        manager.wait_until_finished()
        self._prune(manager)
        for stale in [s for s in manager.all_steps() if s >= step]:
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
            seal_folder(folder, step)

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
        if step not in self._scores:
            try:
                if self.remote is not None:
                    raw = self.remote.read(step, "pipekit/metadata")
                else:
                    raw = (self.root / str(step) / "pipekit" / "metadata").read_bytes()
                self._scores[step] = json.loads(raw).get("score")
            except (OSError, ValueError, AttributeError):
                self._scores[step] = None
        return self._scores[step]

    def _prune(self, manager: ocp.CheckpointManager) -> None:
        steps = self.remote.steps() if self.remote is not None else list(manager.all_steps())
        if not steps:
            return
        scores = {s: self._score_of(s) for s in steps} if self.policy.keep_best else {}
        keep = self.policy.retained(steps, scores)
        for s in steps:
            if s not in keep:
                if self.remote is not None:
                    self.remote.clear(s, marker=FOLDER_DIGEST)
                else:
                    manager.delete(s)
                self._scores.pop(s, None)

    def wait(self) -> None:
        """Block until the pending save is committed, then apply retention."""
        self._wait_pending()
        self._wait_sealed()
        if self._manager is not None and not self._host:
            self._manager.wait_until_finished()
            self._prune(self._manager)

    def close(self) -> None:
        """Wait for pending saves and release the manager (and the staging folder)."""
        try:
            self.wait()
        finally:
            if self._manager is not None:
                self._manager.close()
                self._manager = None
            for pool in (self._writer_pool, self._sealer):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._writer_pool = self._sealer = None
            if self._staging is not None:
                shutil.rmtree(self._staging, ignore_errors=True)

    # -- restoring ---------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Committed steps (at a URI: step folders, sealed or not), ascending."""
        if self.remote is not None:
            return self.remote.steps()
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
                f"The checkpoint at {self._step_location(step)} holds a different model state ({detail}). "
                "Use the model, optimizer and precision it was written with, or a new checkpoint directory."
            )

    @contextmanager
    def _readable(self, step: int) -> Iterator[tuple[Path, str | None]]:
        """`(root holding <step>/, problem)`: the step checked against its digest.

        At a URI the step is downloaded into staging first (and removed afterwards).
        """
        if self.remote is None:
            yield self.root, check_folder(self.root / str(step))
            return
        assert self._staging is not None
        root = self._staging / "restore"
        folder = root / str(step)
        shutil.rmtree(folder, ignore_errors=True)
        try:
            problem: str | None = None
            try:
                self.remote.read(step, FOLDER_DIGEST)
            except FileNotFoundError:
                problem = (
                    f"it has no {FOLDER_DIGEST} (the save was interrupted before its "
                    "commit marker was written)"
                )
            if problem is None:
                try:
                    self.remote.download(step, folder)
                except OSError as exc:
                    problem = f"it could not be downloaded ({type(exc).__name__}: {exc})"
            if problem is None:
                problem = check_folder(folder)
            yield root, problem
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def restore_latest(self, template: Any) -> Restored | None:
        """Restore the newest readable step into `template`'s structure and shardings."""
        self.wait()
        if jax.process_count() > 1:
            # The primary seals in the background: let it finish before anyone checks.
            multihost_utils.sync_global_devices("pipekit_train.equinox:restore")
        abstract = self._template_tree(template)
        for step in reversed(self.steps()):
            with self._readable(step) as (root, problem):
                if problem is not None:
                    warnings.warn(
                        f"Skipping torn checkpoint at {self._step_location(step)} (step {step}): "
                        f"{problem}. Falling back to the previous checkpoint.",
                        TornCheckpointWarning,
                        stacklevel=3,
                    )
                    continue
                restored = self._restore_step(root, step, abstract, template)
            if restored is not None:
                return restored
        return None

    def _restore_step(
        self, root: Path, step: int, abstract: Mapping[str, Any], template: Any
    ) -> Restored | None:
        """Restore one step that passed its digest check (None, with a warning, if Orbax fails)."""
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
            warnings.warn(
                f"Skipping torn checkpoint at {self._step_location(step)}: {type(exc).__name__}: {first}. "
                "Falling back to the previous checkpoint.",
                TornCheckpointWarning,
                stacklevel=4,
            )
            return None
        finally:
            manager.close()
        return Restored(step=step, state=state, meta=meta, path=self._step_location(step))


def abstract_of(tree: Mapping[str, Any]) -> dict[str, jax.ShapeDtypeStruct]:
    """`ShapeDtypeStruct`s (with shardings) of a dict of arrays: a restore template."""
    return {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=getattr(v, "sharding", None))
        for k, v in tree.items()
    }
