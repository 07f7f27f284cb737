"""`pipekit-train run`: train what a config file describes, resume, register."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import IO, Any

from pipekit_train.core._errors import PipekitError
from pipekit_train.core.model._trust import is_model_factory

from ._build import build_loop, python_path
from ._config import RunConfig, load_run_config
from ._progress import ProgressLines
from ._registry_cmd import open_registry
from ._wording import in_cli_terms

__all__ = ["run_command"]


def _register(config: RunConfig, artifact: Any, out: IO[str]) -> None:
    assert config.registry is not None
    registry = open_registry(config.registry["uri"], create=True)
    name = config.registry["name"]
    if registry.versions(name):
        latest = registry.record(name)
        if latest.weights_sha256 == artifact.weights_sha256:
            print(
                f"already registered: {name} version {latest.version} holds these weights "
                f"({latest.uri}); not registered again",
                file=out,
                flush=True,
            )
            return
    record = artifact.register(registry, name)
    print(f"registered: {name} version {record.version} ({record.uri})", file=out, flush=True)


def _warn_untrusted(config: RunConfig, factory: str) -> None:
    """The registry will refuse to rebuild a model whose factory is not marked."""
    from pipekit_train.core._imports import import_string

    if config.registry is None:
        return
    try:
        marked = is_model_factory(import_string(factory))
    except Exception:
        return
    if not marked:
        warnings.warn(
            f"The model factory {factory!r} is not marked with @pipekit_train.core.model_factory: "
            "loading the registered model will need trusted=[...] naming its module.",
            stacklevel=2,
        )


def run_command(
    path: str,
    *,
    backend: str | None = None,
    overrides: Sequence[str] = (),
    dry_run: bool = False,
    out: IO[str] | None = None,
) -> int:
    """Validate, build and run the config at `path`; register the result if configured.

    Returns:
        The exit status (0).

    Raises:
        ConfigError: a bad config, before any work.
    """
    out = out or sys.stdout
    config = load_run_config(path, overrides=overrides, backend=backend)
    mode = config.progress
    if mode == "auto":
        mode = "bar" if sys.stderr.isatty() else "lines"
    extra = (ProgressLines(config.progress_interval_s, file=out),) if mode == "lines" else ()
    with python_path(config.pythonpath):
        built = build_loop(
            config, extra_callbacks=extra, progress_bar=mode == "bar", build_writers=not dry_run
        )
        _warn_untrusted(config, built.model_factory)
        plan = built.loop.plan
        ckpt = plan.checkpoint
        sizes = ", ".join(f"{k}={v}" for k, v in built.data_sizes.items() if v is not None)
        print(
            f"pipekit-train: backend={config.backend}, model={built.model_factory}, "
            f"{plan.total_steps} steps, batch_size={plan.batch_size}, {sizes}",
            file=out,
            flush=True,
        )
        if ckpt is not None:
            print(
                f"checkpoints: {ckpt.path} (every {ckpt.every_n_steps} steps, resume={ckpt.resume})",
                file=out,
                flush=True,
            )
        if dry_run:
            print("dry run: the config is valid; nothing was trained", file=out, flush=True)
            return 0
        try:
            artifact = built.loop.run()
        except PipekitError as exc:
            worded = in_cli_terms(exc, config)
            if worded is exc:
                raise
            raise worded from exc
    resumed = f", {artifact.resume_note}" if artifact.resume_note else ""
    print(
        f"done: {artifact.steps} steps ({artifact.stop_reason}{resumed}) in "
        f"{artifact.wall_time_s:.1f} s",
        file=out,
        flush=True,
    )
    if artifact.final_metrics:
        final = " ".join(f"{k}={v:.6g}" for k, v in sorted(artifact.final_metrics.items()))
        print(f"final: {final}", file=out, flush=True)
    print(f"weights sha256: {artifact.weights_sha256}", file=out, flush=True)
    if config.registry is not None:
        _register(config, artifact, out)
    return 0
