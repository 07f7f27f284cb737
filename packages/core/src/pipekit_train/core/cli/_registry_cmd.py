"""`pipekit-train registry list|show`: read a model registry without loading any model.

Nothing named in a record is imported or called: the commands read the JSON manifests
(checked against their `record_sha256`) and hash the weight bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import IO, Any

from pipekit_train.core._errors import ConfigError, IntegrityError

__all__ = ["open_registry", "registry_list", "registry_show"]

_CHUNK = 1 << 20


def open_registry(uri: str, *, create: bool = False) -> Any:
    """The registry at `uri` (a local folder, `file://`, `s3://`, ...).

    Args:
        uri: where the registry lives.
        create: create a local folder that does not exist (else it is an error).

    Raises:
        ConfigError: a local folder that does not exist (without `create`).
    """
    from pipekit_train.core.registry import FsspecModelRegistry, LocalModelRegistry

    local = "://" not in uri or uri.startswith("file://")
    if local:
        folder = uri[len("file://") :] if uri.startswith("file://") else uri
        if not create and not os.path.isdir(os.path.expanduser(folder)):
            raise ConfigError(
                f"There is no model registry at {uri!r}: the folder does not exist. "
                f"Received: uri={uri!r}. Pass the folder given as registry.uri when training."
            )
        return LocalModelRegistry(uri)
    if uri.startswith(("s3://", "s3a://")):
        from pipekit_train.core.registry import S3ModelRegistry

        return S3ModelRegistry(uri)
    return FsspecModelRegistry(uri)


def _weights_check(registry: Any, record: Any) -> str:
    """`"verified"` if `weights.bin` hashes to the record's SHA-256, else what is wrong."""
    path = f"{registry.fs._strip_protocol(record.uri).rstrip('/')}/weights.bin"
    digest = hashlib.sha256()
    try:
        with registry.fs.open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    except (OSError, FileNotFoundError) as exc:
        return f"unreadable ({type(exc).__name__})"
    if digest.hexdigest() != record.weights_sha256:
        return f"MISMATCH (sha256 {digest.hexdigest()})"
    return "verified"


def _metrics(metrics: dict[str, Any], limit: int = 4) -> str:
    items = sorted(metrics.items(), key=lambda kv: (not kv[0].startswith("val_"), kv[0]))
    text = " ".join(
        f"{k}={v:.4g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in items[:limit]
    )
    return text + (" ..." if len(items) > limit else "")


def registry_list(uri: str, *, as_json: bool = False, out: IO[str] | None = None) -> int:
    """Print every model name with its versions and its latest version's summary."""
    out = out or sys.stdout
    registry = open_registry(uri)
    rows: list[dict[str, Any]] = []
    for name in registry.names():
        row: dict[str, Any] = {"name": name, "versions": registry.versions(name)}
        try:
            record = registry.record(name)
            row.update(
                latest=record.version,
                backend=record.backend,
                created=record.created,
                metrics=record.metrics,
                uri=record.uri,
            )
        except IntegrityError as exc:
            row.update(latest=None, error=str(exc))
        rows.append(row)
    if as_json:
        print(json.dumps({"uri": registry.uri, "models": rows}, indent=2), file=out)
        return 0
    if not rows:
        print(f"{registry.uri}: no models", file=out)
        return 0
    print(f"{registry.uri}: {len(rows)} model(s)", file=out)
    header = ("name", "versions", "latest", "backend", "created", "metrics")
    table = [
        (
            r["name"],
            ",".join(str(v) for v in r["versions"]),
            str(r["latest"]) if r.get("latest") else "DAMAGED",
            str(r.get("backend") or "-"),
            str(r.get("created", "-"))[:19],
            _metrics(r.get("metrics") or {}) if "error" not in r else r["error"][:80],
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(header)]
    for line in (header, *table):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)
    return 0


def _parse_ref(ref: str) -> tuple[str, int | str]:
    name, sep, version = ref.partition(":")
    if not sep or version == "latest":
        return name, "latest"
    if not version.isdigit() or int(version) < 1:
        raise ConfigError(
            f"A model is named NAME or NAME:VERSION (a positive integer or 'latest'). "
            f"Received: {ref!r}. Use e.g. emulator:3."
        )
    return name, int(version)


def registry_show(uri: str, ref: str, *, as_json: bool = False, out: IO[str] | None = None) -> int:
    """Print one version's record; its manifest digest and its weights are verified."""
    out = out or sys.stdout
    registry = open_registry(uri)
    name, version = _parse_ref(ref)
    if isinstance(version, int):
        available = registry.versions(name)
        if available and version not in available:
            raise ConfigError(
                f"Model {name!r} has no complete version {version}. Received: {ref!r}. "
                f"Available versions: {available}. Use `pipekit-train registry show {uri} "
                f"{name}:{available[-1]}`, or {name}:latest (the same as just {name})."
            )
    record = registry.record(name, version)  # verifies the manifest's record_sha256
    weights = _weights_check(registry, record)
    if as_json:
        print(json.dumps({**record.to_json(), "weights_check": weights}, indent=2), file=out)
        return 0 if weights == "verified" else 1
    config = record.config
    lineage = record.lineage
    plan = lineage.get("plan") or {}
    lines = [
        f"{record.name} version {record.version}  ({record.uri})",
        f"  created:   {record.created}",
        f"  backend:   {record.backend}",
        f"  model:     {config.get('type')}  factory={config.get('factory')}  "
        f"seed={config.get('seed')}",
        f"  kwargs:    {json.dumps(config.get('kwargs', {}), sort_keys=True)}",
        f"  weights:   sha256 {record.weights_sha256} ({weights})",
        f"  record:    sha256 {record.record_sha256 or '-'} (verified)",
        f"  metrics:   {_metrics(record.metrics, limit=20) or '-'}",
    ]
    if plan:
        optimizer = plan.get("optimizer", {})
        lines.append(
            f"  training:  steps={lineage.get('steps')} batch_size={plan.get('batch_size')} "
            f"loss={_short(plan.get('loss'))} optimizer={_short(optimizer)} seed={plan.get('seed')}"
        )
    if lineage.get("versions"):
        versions = " ".join(f"{k}={v}" for k, v in sorted(lineage["versions"].items()))
        lines.append(f"  libraries: {versions}")
    if record.normalizer is not None:
        keys = sorted((record.normalizer.get("keys") or {}).keys())
        lines.append(f"  normalizer: keys={keys}")
    print("\n".join(lines), file=out)
    return 0 if weights == "verified" else 1


def _short(value: Any) -> str:
    if isinstance(value, dict):
        name = value.get("name")
        lr = value.get("learning_rate", value.get("lr"))
        if name is not None and lr is not None:
            return f"{name}(lr={_short(lr)})"
        if name is not None:
            return str(name)
        return json.dumps(value, sort_keys=True)
    return str(value)
