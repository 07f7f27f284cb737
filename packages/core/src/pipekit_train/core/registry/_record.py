"""`ModelRecord`: what a registry knows about one registered model version.

The record mirrors the version's `manifest.json` (plus the version's `uri`, which is
derived from where the registry lives rather than stored, so a registry can be moved).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = [
    "MANIFEST_FORMAT",
    "ModelRecord",
    "record_digest",
]

#: The `format` tag written into every manifest.
MANIFEST_FORMAT = "pipekit-train/model-manifest/1"

_REQUIRED = ("name", "version", "config", "weights_sha256", "created")


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
            `mixture_nll` trains); `"flow"` (a normalizing flow, as `flow_nll` trains).
            `NeuralForward.from_record` uses it.
        head_options: the head's options, if it has any: `{"n_components": K,
            "covariance": "diag" | "full"}` for `"mixture"`, `{"flow_layers": L,
            "flow_bins": K, "flow_bound": B}` for `"flow"` (plus `"flow_hidden": H` for
            a coupled flow; absent, as in every record written before the option, it is
            0); None otherwise.
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
