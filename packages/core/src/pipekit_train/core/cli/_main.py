"""The `pipekit-train` command line: argument parsing and error reporting."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pipekit_train.core._errors import ConfigError, PipekitError
from pipekit_train.core.run._preemption import PREEMPTED_EXIT_STATUS, Preempted

__all__ = ["main"]

_EPILOG = """\
examples:
  pipekit-train run examples/cli_direct.toml --backend keras
  pipekit-train run run.toml --set max_steps=5000 --set optimizer.lr=3e-4
  pipekit-train registry list runs/models
  pipekit-train registry show runs/models emulator:3
  pipekit-train evaluate runs/models emulator:3 --data mymodule:test_set --metrics mae
  pipekit-train checkpoint inspect runs/exp1/checkpoints

docs: https://pipekit.github.io/pipekit-train/cli/
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipekit-train",
        description="Train from a config file, read a model registry, inspect checkpoints.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="train what a TOML/JSON config describes (resumes from its checkpoint)",
        description="Train what a TOML/JSON config describes; resume from the latest "
        "complete checkpoint if one exists; register the result if [registry] is set.",
    )
    run.add_argument("config", help="the run config (.toml or .json)")
    run.add_argument(
        "--backend",
        help="override the config's backend: an installed one (equinox, lightning, keras, "
        "numpy, or any registered under the 'pipekit_train.backends' entry points)",
    )
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value (dotted key, TOML value), e.g. --set optimizer.lr=1e-3",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config, build the data and model, then stop before training",
    )

    registry = commands.add_parser("registry", help="list or show registered models")
    parser.set_defaults(usage=parser)
    registry.set_defaults(usage=registry)
    registry_commands = registry.add_subparsers(dest="registry_command", metavar="COMMAND")
    listing = registry_commands.add_parser("list", help="every model name and its versions")
    listing.add_argument("uri", help="the registry: a folder, file://, s3://, ...")
    listing.add_argument("--json", action="store_true", help="print JSON")
    show = registry_commands.add_parser("show", help="one version's record, verified")
    show.add_argument("uri", help="the registry: a folder, file://, s3://, ...")
    show.add_argument("ref", metavar="NAME[:VERSION]", help="the model (default: latest version)")
    show.add_argument("--json", action="store_true", help="print JSON")

    evaluate = commands.add_parser(
        "evaluate",
        help="a registered model's loss and metrics on a dataset",
        description="Rebuild a registered model (verified) and compute its loss and metrics "
        "on the dataset an importable factory returns (nothing is trained or written).",
    )
    evaluate.add_argument("uri", help="the registry: a folder, file://, s3://, ...")
    evaluate.add_argument("ref", metavar="NAME[:VERSION]", help="the model (default: latest)")
    evaluate.add_argument(
        "--data", required=True, metavar="MODULE:FACTORY", help="returns the dataset (x, y)"
    )
    evaluate.add_argument("--data-kwargs", metavar="JSON", help="keyword arguments of --data")
    evaluate.add_argument(
        "--metrics", metavar="NAMES", help="comma-separated metrics (default: the run's)"
    )
    evaluate.add_argument("--loss", metavar="NAME", help="the loss (default: the run's)")
    evaluate.add_argument(
        "--batch-size", type=int, help="rows per prediction (default: the run's batch size)"
    )
    evaluate.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="PATTERN",
        help="trust the model's factory (a module prefix or module:name), repeatable",
    )
    evaluate.add_argument("--json", action="store_true", help="print JSON")

    checkpoint = commands.add_parser("checkpoint", help="inspect a checkpoint folder")
    checkpoint.set_defaults(usage=checkpoint)
    checkpoint_commands = checkpoint.add_subparsers(dest="checkpoint_command", metavar="COMMAND")
    inspect = checkpoint_commands.add_parser(
        "inspect", help="steps, which are complete (verified), their metadata"
    )
    inspect.add_argument("directory", help="the checkpoint folder (checkpoint.directory)")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    lease = checkpoint_commands.add_parser(
        "lease", help="which run holds the location (one run per checkpoint location)"
    )
    lease.add_argument("location", help="the checkpoint location (folder or fsspec URI)")
    lease.add_argument("--json", action="store_true", help="print JSON")
    lease.add_argument(
        "--lease-timeout",
        type=float,
        default=120.0,
        help="the run's Checkpoint(lease_timeout=...) in seconds: when a silent holder is "
        "taken over (default 120)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `pipekit-train` command line; returns the exit status.

    Exit status: 0 on success, 2 for a bad config or command line (nothing was done),
    1 when a command found a problem (a torn checkpoint folder, a damaged registry
    record) or a run failed with a pipekit-train error, 75 (`PREEMPTED_EXIT_STATUS`)
    when a preemption signal stopped a run after checkpointing it (rerun to resume).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        import importlib.metadata

        print(f"pipekit-train {importlib.metadata.version('pipekit-train-core')}")
        return 0
    try:
        if args.command == "run":
            from ._run import run_command

            return run_command(
                args.config, backend=args.backend, overrides=args.overrides, dry_run=args.dry_run
            )
        if args.command == "registry" and args.registry_command == "list":
            from ._registry_cmd import registry_list

            return registry_list(args.uri, as_json=args.json)
        if args.command == "registry" and args.registry_command == "show":
            from ._registry_cmd import registry_show

            return registry_show(args.uri, args.ref, as_json=args.json)
        if args.command == "evaluate":
            from ._evaluate_cmd import evaluate_command

            return evaluate_command(
                args.uri,
                args.ref,
                data=args.data,
                data_kwargs=args.data_kwargs,
                metrics=args.metrics,
                loss=args.loss,
                batch_size=args.batch_size,
                trust=args.trust,
                as_json=args.json,
            )
        if args.command == "checkpoint" and args.checkpoint_command == "inspect":
            from ._inspect import checkpoint_inspect

            return checkpoint_inspect(args.directory, as_json=args.json)
        if args.command == "checkpoint" and args.checkpoint_command == "lease":
            from ._lease_cmd import checkpoint_lease

            if not args.lease_timeout > 0:
                raise ConfigError(
                    "`--lease-timeout` must be a positive number of seconds. Received: "
                    f"lease_timeout={args.lease_timeout!r}. Use the run's "
                    "Checkpoint(lease_timeout=...), 120 by default."
                )
            return checkpoint_lease(
                args.location, as_json=args.json, lease_timeout=args.lease_timeout
            )
    except ConfigError as exc:
        print(f"pipekit-train: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional extra (tensorboard, wandb, s3fs, ...) is missing
        print(f"pipekit-train: error: {exc}", file=sys.stderr)
        return 2
    except Preempted as exc:
        print(f"pipekit-train: preempted: {exc}", file=sys.stderr)
        return PREEMPTED_EXIT_STATUS
    except PipekitError as exc:
        print(f"pipekit-train: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    args.usage.print_help(sys.stderr)  # no (sub)command given
    return 2
