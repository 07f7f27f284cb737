"""The model registry: versioned, integrity-checked storage of trained model operators.

Layout under the registry root (a local folder or an object-store prefix):

```
<root>/<name>/<version>/.claim          who claimed the version (JSON: token, host, pid, time)
<root>/<name>/<version>/weights.bin     model_op.serialize_weights()
<root>/<name>/<version>/manifest.json   config, weights SHA-256, metrics, lineage, created,
                                        normalizer, head (written last: the commit point)
```

`register()` picks `N = 1 + the highest version present`, claims it by an atomic
exclusive create of `.claim` (see `_claims.py`), reads the claim back, writes the
weights, checks the claim again and writes the manifest. A writer that loses the race
for `N` moves on to `N + 1` (or past the highest version it now sees), so concurrent
writers in different processes or on different machines get distinct versions and
nothing is lost. A version without a complete manifest — a writer that died mid-way —
is invisible: it is not listed, not "latest", and its number is not reused.

Nothing on the load path executes code the store chose: the manifest is JSON, the
whole record (manifest and, through its SHA-256, the weights) is checked against the
`record_sha256` digest written at registration, and the operator is rebuilt only from a
trusted class and factory (`model_op_from_config(config, trusted=...)`: factories marked
with `@model_factory` or on the `trusted=` allow-list; see `pipekit_train.core.model._trust`
and docs/guides/registry_and_cycle.md for the threat model). The weight bytes are
checked against the manifest's SHA-256 before they reach the operator.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import socket
import sys
import uuid
import warnings
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from pipekit_train.core._errors import ConfigError, IntegrityError, PipekitError
from pipekit_train.core._imports import optional_import
from pipekit_train.core._json import to_json_value
from pipekit_train.core.data._normalizer import normalizer_to_dict
from pipekit_train.core.distributions._heads import check_head, check_head_options
from pipekit_train.core.model._operators import model_op_from_config
from pipekit_train.core.model._trust import TrustedList

from ._claims import exclusive_create, fresh_ls, is_local, put_atomic, read_or_none
from ._record import MANIFEST_FORMAT, ModelRecord

__all__ = [
    "FsspecModelRegistry",
    "LocalModelRegistry",
    "ModelRegistry",
    "RegistryError",
    "S3ModelRegistry",
    "UnverifiedRecordWarning",
]

MANIFEST = "manifest.json"
WEIGHTS = "weights.bin"
CLAIM = ".claim"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MAX_CLAIM_ATTEMPTS = 1000


class RegistryError(PipekitError):
    """The registry could not complete an operation (e.g. no version could be claimed)."""


class UnverifiedRecordWarning(UserWarning):
    """A record written before manifests carried `record_sha256`: only its weights are verified."""


@runtime_checkable
class ModelRegistry(Protocol):
    """Versioned storage of trained model operators (see `FsspecModelRegistry`)."""

    def register(
        self,
        name: str,
        model_op: Any,
        *,
        metrics: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
        normalizer: Any = None,
        head: str | None = None,
        head_options: Mapping[str, Any] | None = None,
    ) -> ModelRecord:
        """Store a new version of `name` and return its record."""
        ...

    def load(self, name: str, version: int | str = "latest", *, trusted: TrustedList = None) -> Any:
        """Rebuild the model operator of a version, with a verified record and weights."""
        ...

    def record(self, name: str, version: int | str = "latest") -> ModelRecord:
        """The record (manifest) of a version."""
        ...

    def versions(self, name: str) -> list[int]:
        """The complete versions of `name`, ascending."""
        ...

    def names(self) -> list[str]:
        """The names that have at least one complete version, sorted."""
        ...


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", ".."):
        raise ConfigError(
            "`name` must be 1-128 characters of letters, digits, '.', '_' or '-', starting "
            f"with a letter or digit. Received: name={name!r}. Use e.g. 'oscillator-emulator'."
        )
    return name


def _check_version(version: Any) -> int | str:
    if version == "latest" and isinstance(version, str):
        return version
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(
            f'`version` must be a positive int or "latest". Received: version={version!r}.'
        )
    return int(version)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _lib_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for dist in ("pipekit-train-core", "numpy"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:  # pragma: no cover - always installed in practice
            pass
    return out


class FsspecModelRegistry:
    """A `ModelRegistry` on any fsspec filesystem (local folder, S3, GCS, memory, ...).

    Args:
        uri: the registry root, e.g. `"/data/models"`, `"file:///data/models"`,
            `"s3://bucket/models"`.
        **storage_options: passed to fsspec (e.g. `key`, `secret`,
            `client_kwargs={"endpoint_url": ...}` for s3fs).

    Examples:
        ```python
        registry = LocalModelRegistry("models")
        record = registry.register("emulator", artifact.model, metrics={"val_loss": 0.01})
        model_op = registry.load("emulator")              # the latest version
        record, model_op = registry.load_record_and_model("emulator", version=record.version)
        ```
    """

    def __init__(self, uri: str | os.PathLike[str], **storage_options: Any):
        import fsspec.core

        if not isinstance(uri, (str, os.PathLike)) or not str(uri):
            raise ConfigError(
                f"`uri` must be a path or URL string. Received: uri={uri!r}. "
                "Use e.g. '/data/models' or 's3://bucket/models'."
            )
        self.uri = str(uri)
        self.fs, root = fsspec.core.url_to_fs(self.uri, **storage_options)
        self.root = root.rstrip("/") if root not in ("/", "") else root
        if is_local(self.fs):
            os.makedirs(self.root, exist_ok=True)

    # -- paths -------------------------------------------------------------------------
    def _join(self, *parts: str | int) -> str:
        return "/".join([self.root.rstrip("/"), *(str(p) for p in parts)])

    def _version_uri(self, name: str, version: int) -> str:
        return self.fs.unstrip_protocol(self._join(name, version))

    # -- reading -----------------------------------------------------------------------
    def _claimed_versions(self, name: str) -> list[int]:
        """Every version number that has been claimed (complete or not)."""
        return sorted(
            int(e) for e in fresh_ls(self.fs, self._join(name)) if e.isdigit() and e[0] != "0"
        )

    def _parse_manifest(self, name: str, version: int, raw: bytes | None) -> ModelRecord | None:
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
                return None
            record = ModelRecord.from_json(data, uri=self._version_uri(name, version))
        except (ValueError, ConfigError):
            return None
        if record.name != name or record.version != version:
            return None
        return record

    def _complete_records(self, name: str) -> dict[int, ModelRecord]:
        claimed = self._claimed_versions(name)
        if not claimed:
            return {}
        paths = {self._join(name, v, MANIFEST): v for v in claimed}
        self.fs.invalidate_cache(self._join(name))
        try:
            raw = self.fs.cat(list(paths), on_error="omit")
        except FileNotFoundError:  # fsspec raises when none of the paths exists
            return {}
        out = {}
        for path, blob in raw.items():
            version = paths.get(path) or paths.get(self.fs._strip_protocol(path))
            if version is None:
                continue
            record = self._parse_manifest(name, version, blob)
            if record is not None:
                out[version] = record
        return out

    def versions(self, name: str) -> list[int]:
        """The complete versions of `name`, ascending (empty if none).

        A version whose manifest is missing or unreadable (a registration that died part
        way) is not listed.
        """
        _check_name(name)
        return sorted(self._complete_records(name))

    def names(self) -> list[str]:
        """The names with at least one complete version, sorted."""
        found = []
        for entry in fresh_ls(self.fs, self.root):
            if _NAME_RE.match(entry) and self._complete_records(entry):
                found.append(entry)
        return sorted(found)

    def _verify(self, record: ModelRecord) -> ModelRecord:
        """Check the record digest; an old record without one loads with a warning."""
        where = f"Model {record.name!r} version {record.version} at {record.uri!r}"
        if record.record_sha256 is None:
            warnings.warn(
                f"{where} was registered by an older pipekit-train: its manifest has no "
                "`record_sha256`, so its config, metrics and normalizer are not verified "
                "(its weights still are). Register the model again to cover the whole record.",
                UnverifiedRecordWarning,
                stacklevel=3,
            )
            return record
        actual = record.digest()
        if actual != record.record_sha256:
            raise IntegrityError(
                f"{where}: the manifest does not match its digest. Expected "
                f"record_sha256={record.record_sha256}, actual sha256={actual}. Its config, "
                "metrics, lineage or normalizer were modified or damaged after registration; "
                "do not use it."
            )
        return record

    def _resolve(self, name: str, version: int | str) -> ModelRecord:
        _check_name(name)
        version = _check_version(version)
        if isinstance(version, str):  # "latest": `_check_version` returns no other string
            records = self._complete_records(name)
            if not records:
                raise ConfigError(
                    f"The registry at {self.uri!r} has no model named {name!r}. "
                    f"Received: name={name!r}. Registered names: {self.names()}."
                )
            return self._verify(records[max(records)])
        raw = read_or_none(self.fs, self._join(name, version, MANIFEST))
        record = self._parse_manifest(name, version, raw)
        if record is None:
            available = self.versions(name)
            if not available:
                raise ConfigError(
                    f"The registry at {self.uri!r} has no model named {name!r}. "
                    f"Received: name={name!r}. Registered names: {self.names()}."
                )
            raise ConfigError(
                f"Model {name!r} has no complete version {version}. Received: version={version}. "
                f"Available versions: {available} (or use version='latest')."
            )
        return self._verify(record)

    def record(self, name: str, version: int | str = "latest") -> ModelRecord:
        """The `ModelRecord` of a version (default: the latest complete one).

        Raises:
            ConfigError: bad name or version, or no such model/version.
            IntegrityError: the manifest does not match its `record_sha256`.
        """
        return self._resolve(name, version)

    def load_record_and_model(
        self, name: str, version: int | str = "latest", *, trusted: TrustedList = None
    ) -> tuple[ModelRecord, Any]:
        """Load one version's record and its model operator together (one resolution of
        `"latest"`, so both describe the same version).

        In order, before any stored name is imported or called: the manifest is checked
        against its `record_sha256` (a record from an older pipekit-train without one gives
        an `UnverifiedRecordWarning`), the weights against the manifest's SHA-256, and the
        config's `type` and `factory` against the trust rules. Only then is the operator
        rebuilt (`model_op_from_config(record.config, trusted=trusted)`) and given the
        weights (`op.with_weights(blob)`). Nothing is unpickled.

        Args:
            name: the model name.
            version: a version number or `"latest"`.
            trusted: code you trust beyond the factories marked with `@model_factory`:
                module prefixes (`"mypkg.models"`), exact paths (`"mypkg.models:mlp"`),
                modules or factories. Standard-library paths are refused regardless.

        Returns:
            `(record, model_op)`.

        Raises:
            ConfigError: bad name or version, or no such model/version.
            IntegrityError: the manifest does not match its digest, or `weights.bin` is
                missing or its SHA-256 differs from the manifest's.
            UntrustedFactoryError: the config names a class or factory that is not trusted;
                it was not called (the message says how to trust it).
        """
        record = self._resolve(name, version)
        path = self._join(name, record.version, WEIGHTS)
        blob = read_or_none(self.fs, path)
        if blob is None:
            raise IntegrityError(
                f"Model {name!r} version {record.version} has a manifest but no weights at "
                f"{self.fs.unstrip_protocol(path)!r}. The registry entry is damaged; register the model again."
            )
        actual = _sha256(blob)
        if actual != record.weights_sha256:
            raise IntegrityError(
                f"Model {name!r} version {record.version}: the weights at "
                f"{self.fs.unstrip_protocol(path)!r} do not match the manifest. "
                f"Expected sha256={record.weights_sha256}, actual sha256={actual}. "
                "The blob was modified or damaged after registration; do not use it."
            )
        model_op = model_op_from_config(record.config, trusted=trusted).with_weights(blob)
        return record, model_op

    def load(self, name: str, version: int | str = "latest", *, trusted: TrustedList = None) -> Any:
        """Rebuild the model operator of a version (default: the latest) with verified weights.

        See `load_record_and_model` for the checks made and for `trusted`.
        """
        return self.load_record_and_model(name, version, trusted=trusted)[1]

    # -- writing -----------------------------------------------------------------------
    def register(
        self,
        name: str,
        model_op: Any,
        *,
        metrics: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
        normalizer: Any = None,
        head: str | None = None,
        head_options: Mapping[str, Any] | None = None,
    ) -> ModelRecord:
        """Store `model_op` as a new version of `name` and return its record.

        Args:
            name: letters, digits, `.`, `_`, `-` (1-128 characters, starting with a letter
                or digit).
            model_op: a model operator (`get_config()`, `serialize_weights()`).
            metrics: metrics to record (JSON; numpy scalars are converted).
            lineage: provenance (`plan`, `sweep_id`, ...). `backend` and `versions` are
                filled in when absent.
            normalizer: a normalizer to store with the model: a `Normalizer` (or any object
                with `to_dict()`/`to_json()`), its JSON dict, or its JSON string. It comes
                back as `record.normalizer` (a dict); `record.load_normalizer()` rebuilds
                a core `Normalizer`.
            head: what the model's output means: `"gaussian"` (a mean and a log-variance
                per target value, the layout `gaussian_nll` trains), `"mixture"` (a
                Gaussian mixture, the layout `mixture_nll` trains), `"flow"` (a
                conditional normalizing flow, the layout `flow_nll` trains) or `"point"`;
                None records nothing (read as `"point"`). It comes back as `record.head`,
                and `NeuralForward.from_record` uses it to return a `Gaussian`, a
                `Mixture` or a `Flow` in original units.
            head_options: for `head="mixture"`, `{"n_components": K}` (and
                `"covariance": "full"` for a full-covariance mixture; default `"diag"`);
                for `head="flow"`, `{"flow_layers": L, "flow_bins": K, "flow_bound": B}`
                and, for a coupled flow, `"flow_hidden": H` (missing keys: `flow_nll`'s
                defaults, recorded filled in, except `flow_hidden`, recorded only when it
                is not 0, so a record without it is an element-wise flow); recorded as
                `record.head_options` and covered by the record digest.

        Returns:
            The new version's `ModelRecord`.

        Raises:
            ConfigError: a bad name or head, or a model/metrics/lineage/normalizer that
                cannot be stored as JSON — raised before anything is written.
            RegistryError: no version could be claimed after many attempts.
        """
        _check_name(name)
        options = None
        if head is not None:
            options = check_head_options(check_head(head), head_options)
        elif head_options:
            raise ConfigError(
                f"`head_options` needs a `head`. Received: head_options={head_options!r}, "
                "head=None. Pass head='mixture' or head='flow' with it."
            )
        for attr in ("get_config", "serialize_weights"):
            if not callable(getattr(model_op, attr, None)):
                raise ConfigError(
                    f"`model_op` must be a model operator with `get_config()` and "
                    f"`serialize_weights()`. Received: a {type(model_op).__name__} without `{attr}`."
                )
        config = to_json_value(model_op.get_config(), field_name="model_op.get_config()")
        if not isinstance(config, dict) or not isinstance(config.get("type"), str):
            raise ConfigError(
                "`model_op.get_config()` must be a dict with a `type` ('module:Class') so the "
                f"model can be rebuilt. Received: config={config!r:.120}."
            )
        blob = model_op.serialize_weights()
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise ConfigError(
                "`model_op.serialize_weights()` must return bytes. "
                f"Received: a {type(blob).__name__}."
            )
        blob = bytes(blob)
        metrics_json = to_json_value(dict(metrics or {}), field_name="metrics")
        lineage_json = to_json_value(dict(lineage or {}), field_name="lineage")
        lineage_json.setdefault(
            "backend", config.get("backend", getattr(model_op, "backend", None))
        )
        lineage_json.setdefault("versions", _lib_versions())
        normalizer_json = normalizer_to_dict(normalizer)
        sha = _sha256(blob)
        token = uuid.uuid4().hex

        version = self._next_free(name, 1)
        for _ in range(_MAX_CLAIM_ATTEMPTS):
            if self._claim(name, version, token):
                put_atomic(self.fs, self._join(name, version, WEIGHTS), blob)
                # A second look catches a claimant that overwrote ours on a store without
                # atomic create-if-absent (see `_claims.py`).
                if self._holder(name, version) == token:
                    record = ModelRecord(
                        name=name,
                        version=version,
                        uri=self._version_uri(name, version),
                        config=config,
                        weights_sha256=sha,
                        metrics=metrics_json,
                        lineage=lineage_json,
                        created=datetime.now(UTC).isoformat(timespec="microseconds"),
                        normalizer=normalizer_json,
                        head=head,
                        head_options=options,
                    )
                    record = dataclasses.replace(record, record_sha256=record.digest())
                    manifest = json.dumps(
                        record.to_manifest(), indent=2, sort_keys=True, allow_nan=False
                    )
                    self._commit_manifest(name, version, manifest.encode())
                    return record
            version = self._next_free(name, version + 1)
        raise RegistryError(
            f"Could not claim a version of {name!r} in {self.uri!r} after {_MAX_CLAIM_ATTEMPTS} "
            "attempts; other writers keep winning. Retry later."
        )

    def _next_free(self, name: str, at_least: int) -> int:
        claimed = self._claimed_versions(name)
        return max(at_least, (claimed[-1] + 1) if claimed else 1)

    def _claim(self, name: str, version: int, token: str) -> bool:
        marker = self._join(name, version, CLAIM)
        if read_or_none(self.fs, marker) is not None:
            return False
        payload = json.dumps(
            {
                "token": token,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "time": datetime.now(UTC).isoformat(),
            },
            sort_keys=True,
        ).encode()
        if not exclusive_create(self.fs, marker, payload):
            return False
        return self._holder(name, version) == token

    def _holder(self, name: str, version: int) -> str | None:
        raw = read_or_none(self.fs, self._join(name, version, CLAIM))
        try:
            return json.loads(raw)["token"] if raw else None
        except (ValueError, KeyError, TypeError):
            return None

    def _commit_manifest(self, name: str, version: int, data: bytes) -> None:
        path = self._join(name, version, MANIFEST)
        if is_local(self.fs):
            put_atomic(self.fs, path, data)  # the O_EXCL claim already makes us the only writer
        elif not exclusive_create(self.fs, path, data):
            raise RegistryError(
                f"Version {version} of {name!r} in {self.uri!r} was committed by another writer "
                "while this one held its claim; the store does not honour conditional writes. "
                "Retry the registration."
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


class LocalModelRegistry(FsspecModelRegistry):
    """A `ModelRegistry` in a local folder (created if missing).

    Args:
        root: the registry folder (a path, or a `file://` URL).
    """

    def __init__(self, root: str | os.PathLike[str]):
        if not isinstance(root, (str, os.PathLike)) or not str(root):
            raise ConfigError(f"`root` must be a folder path. Received: root={root!r}.")
        root = str(root)
        if "://" in root and not root.startswith("file://"):
            raise ConfigError(
                f"`root` must be a local folder. Received: root={root!r}. "
                "Use S3ModelRegistry or FsspecModelRegistry for remote storage."
            )
        if not root.startswith("file://"):
            root = os.path.abspath(os.path.expanduser(root))
        super().__init__(root)


class S3ModelRegistry(FsspecModelRegistry):
    """A `ModelRegistry` under an S3 prefix (needs `pipekit-train-core[s3]`, i.e. s3fs).

    Versions are claimed with conditional writes (`If-None-Match: *`), supported by AWS S3
    and by most S3-compatible servers. On a server that silently ignores the condition,
    the claim is read back and checked again before committing, and the manifest is
    written with the same condition; a collision that slips through all three checks is
    still caught at load time by the SHA-256 check.

    Args:
        uri: `"s3://bucket/prefix"`.
        **storage_options: s3fs options (`key`, `secret`, `anon`,
            `client_kwargs={"endpoint_url": ...}`, ...).
    """

    def __init__(self, uri: str, **storage_options: Any):
        if (
            not isinstance(uri, str)
            or not uri.startswith(("s3://", "s3a://"))
            or len(uri.split("://", 1)[1].strip("/")) == 0
        ):
            raise ConfigError(
                f"`uri` must be an S3 URL 's3://bucket/prefix'. Received: uri={uri!r}."
            )
        optional_import("s3fs", extra="s3", package="pipekit-train-core")
        super().__init__(uri, **storage_options)
