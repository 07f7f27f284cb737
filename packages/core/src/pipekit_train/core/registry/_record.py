"""`ModelRecord`: what a registry knows about one registered model version.

The record mirrors the version's `manifest.json` (plus the version's `uri`, which is
derived from where the registry lives rather than stored, so a registry can be moved).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

__all__ = [
    "MANIFEST_FORMAT",
    "ModelRecord",
    "normalizer_to_dict",
    "record_digest",
    "to_json_value",
]

#: The `format` tag written into every manifest.
MANIFEST_FORMAT = "pipekit-train/model-manifest/1"

_REQUIRED = ("name", "version", "config", "weights_sha256", "created")


def to_json_value(value: Any, *, field_name: str) -> Any:
    """Return `value` as plain JSON (dict/list/str/int/float/bool/None).

    numpy scalars and arrays become Python numbers and lists, tuples become lists,
    non-finite floats become the strings `"nan"`, `"inf"`, `"-inf"` (strict JSON has no
    NaN), and objects with `to_json()` are replaced by what it returns.

    Raises:
        ConfigError: something cannot be represented as JSON.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else ("nan" if math.isnan(f) else ("inf" if f > 0 else "-inf"))
    if isinstance(value, np.ndarray):
        return to_json_value(value.tolist(), field_name=field_name)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(
                    f"`{field_name}` must have string keys to be stored as JSON. "
                    f"Received: key {k!r} of type {type(k).__name__}. Use str keys."
                )
            out[k] = to_json_value(v, field_name=field_name)
        return out
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, field_name=field_name) for v in value]
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        got = to_json()
        if isinstance(got, str):
            got = json.loads(got)
        return to_json_value(got, field_name=field_name)
    raise ConfigError(
        f"`{field_name}` must be JSON-serialisable (numbers, strings, lists, dicts). "
        f"Received: a {type(value).__name__} ({value!r:.80}). Convert it to plain JSON first."
    )


def record_digest(manifest: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of a manifest's canonical JSON, without its `record_sha256` field.

    Canonical JSON: sorted keys, no whitespace, ASCII only, no NaN. The manifest holds the
    weights' SHA-256, so the digest covers the whole record: config (type, factory,
    kwargs, seed), metrics, lineage, normalizer, creation time and weights.
    """
    body = {k: v for k, v in manifest.items() if k != "record_sha256"}
    text = json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def normalizer_to_dict(normalizer: Any) -> dict[str, Any] | None:
    """The JSON dict of a normalizer.

    Accepts `None`, a dict, a JSON string (what `Normalizer.to_json()` returns), or an
    object with `to_dict()` or `to_json()` (returning a dict or a JSON string).

    Raises:
        ConfigError: the result is not a JSON object.
    """
    if normalizer is None:
        return None
    value = normalizer
    if not isinstance(value, (Mapping, str, bytes)):
        to_dict = getattr(value, "to_dict", None)
        to_json = getattr(value, "to_json", None)
        if callable(to_dict):
            value = to_dict()
        elif callable(to_json):
            value = to_json()
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(
                f"`normalizer` given as a string must be JSON. Received: normalizer={value!r:.80}."
            ) from exc
    value = to_json_value(value, field_name="normalizer")
    if not isinstance(value, dict):
        raise ConfigError(
            "`normalizer` must be a JSON object, or have `to_dict()`/`to_json()` returning one. "
            f"Received: normalizer={value!r:.80}."
        )
    return value


@dataclass(frozen=True)
class ModelRecord:
    """One registered model version (the content of its `manifest.json`).

    Attributes:
        name: the model name.
        version: the version number (1, 2, ...).
        uri: where the version lives (`file:///.../name/3`, `s3://bucket/prefix/name/3`).
        config: the model operator's config (`model_op.get_config()`: type, factory,
            kwargs, seed, backend) — enough to rebuild it with `model_op_from_config`.
        weights_sha256: SHA-256 (hex) of `weights.bin`.
        metrics: metrics recorded with the model (JSON).
        lineage: where the model came from: `plan`, `sweep_id`, `versions`, `backend`, ... (JSON).
        created: registration time, ISO 8601 in UTC.
        normalizer: the normalizer's JSON, if one was registered with the model.
        head: what the model's output means, if recorded: `"gaussian"` (a mean and a
            log-variance per target value, as `gaussian_nll` trains) or `"point"`; None
            (not recorded) reads as `"point"`; `"mixture"` (a Gaussian mixture, as
            `mixture_nll` trains). `NeuralForward.from_record` uses it.
        head_options: the head's options, if it has any: `{"n_components": K,
            "covariance": "diag" | "full"}` for `"mixture"`; None otherwise.
        record_sha256: `record_digest` of the manifest (every field above but `uri`),
            checked on `record()`/`load()`; None for a record written before pipekit-train
            stored it (only its weights are then verified).
    """

    name: str
    version: int
    uri: str
    config: dict[str, Any]
    weights_sha256: str
    metrics: dict[str, Any] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    normalizer: dict[str, Any] | None = None
    head: str | None = None
    head_options: dict[str, Any] | None = None
    record_sha256: str | None = None

    def load_normalizer(self) -> Any:
        """Rebuild the registered normalizer (`pipekit_train.core.data.Normalizer`), or None.

        Raises:
            ConfigError: the stored JSON is not a serialised core `Normalizer`; rebuild a
                custom normalizer from `record.normalizer` yourself.
        """
        if self.normalizer is None:
            return None
        from pipekit_train.core.data._normalizer import Normalizer

        return Normalizer.from_dict(self.normalizer)

    @property
    def backend(self) -> str | None:
        """The model operator's backend (`config["backend"]`), if recorded."""
        return self.config.get("backend")

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON dict (every field, including `uri`)."""
        return {
            "name": self.name,
            "version": self.version,
            "uri": self.uri,
            "config": self.config,
            "weights_sha256": self.weights_sha256,
            "metrics": self.metrics,
            "lineage": self.lineage,
            "created": self.created,
            "normalizer": self.normalizer,
            "head": self.head,
            "head_options": self.head_options,
            "record_sha256": self.record_sha256,
        }

    def to_manifest(self) -> dict[str, Any]:
        """The `manifest.json` content: every field but `uri`, plus the `format` tag.

        `record_sha256` is left out while it is None (a record being built, or an old one),
        and so are `head` and `head_options` (not recorded), so records written before
        they existed keep their digest.
        """
        manifest = {"format": MANIFEST_FORMAT, **self.to_json()}
        del manifest["uri"]
        for optional in ("head", "head_options"):
            if manifest[optional] is None:
                del manifest[optional]
        if manifest["record_sha256"] is None:
            del manifest["record_sha256"]
        return manifest

    def digest(self) -> str:
        """`record_digest` of this record's manifest (what `record_sha256` must equal)."""
        return record_digest(self.to_manifest())

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str, *, uri: str | None = None) -> ModelRecord:
        """Rebuild a record from `to_json()` output (a dict or its JSON text) or a manifest.

        Args:
            data: the JSON dict or string.
            uri: the version's location; required when `data` has no `uri` (a manifest).

        Raises:
            ConfigError: a field is missing or has the wrong type.
        """
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise ConfigError(
                    f"A model record must be JSON. Received: {data!r:.80} ({exc})."
                ) from exc
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"A model record must be a JSON object. Received: {type(data).__name__}."
            )
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise ConfigError(
                f"A model record needs the fields {list(_REQUIRED)}. Received: missing={missing}."
            )
        version = data["version"]
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigError(f"`version` must be a positive int. Received: version={version!r}.")
        config = data["config"]
        if not isinstance(config, Mapping) or "type" not in config:
            raise ConfigError(
                f"`config` must be a model operator config with a `type`. Received: config={config!r:.120}."
            )
        sha = data["weights_sha256"]
        if not isinstance(sha, str) or len(sha) != 64:
            raise ConfigError(
                f"`weights_sha256` must be a hex SHA-256. Received: weights_sha256={sha!r}."
            )
        record_uri = uri if uri is not None else data.get("uri")
        if not isinstance(record_uri, str):
            raise ConfigError("A model record needs a `uri`. Received: uri=None. Pass `uri=`.")
        normalizer = data.get("normalizer")
        head = data.get("head")
        if head is not None and not isinstance(head, str):
            raise ConfigError(f"`head` must be a string or absent. Received: head={head!r:.80}.")
        head_options = data.get("head_options")
        if head_options is not None and not isinstance(head_options, Mapping):
            raise ConfigError(
                f"`head_options` must be a JSON object or absent. Received: "
                f"head_options={head_options!r:.80}."
            )
        digest = data.get("record_sha256")
        if digest is not None and (not isinstance(digest, str) or len(digest) != 64):
            raise ConfigError(
                f"`record_sha256` must be a hex SHA-256. Received: record_sha256={digest!r}."
            )
        return cls(
            name=str(data["name"]),
            version=version,
            uri=record_uri,
            config=dict(config),
            weights_sha256=sha,
            metrics=dict(data.get("metrics") or {}),
            lineage=dict(data.get("lineage") or {}),
            created=str(data["created"]),
            normalizer=None if normalizer is None else dict(normalizer),
            head=head,
            head_options=None if head_options is None else dict(head_options),
            record_sha256=digest,
        )
