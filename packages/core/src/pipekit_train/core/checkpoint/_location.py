"""Where checkpoints live: a local folder, or any fsspec URI (`s3://`, `gs://`, `memory://`).

`parse_location` validates a `Checkpoint.directory` (and its `storage_options`) without
touching any storage: it only looks the URI's protocol up in fsspec's registry, so an
unknown protocol, or one whose implementation is not installed, is refused before any
work. `file://` (and fsspec's `local://`) URIs are local folders.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["Location", "check_lease_store", "parse_location"]

# `scheme://...` (an RFC 3986 scheme of two or more characters), and `scheme:/...`, which
# is what `Path("s3://bucket/run")` turns it into. A Windows drive (`C:/runs`) does not match.
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")
# The pipekit-train-core extra that installs a protocol's fsspec implementation.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
_LOCAL = ("file", "local")


@dataclass(frozen=True)
class Location:
    """A parsed checkpoint location.

    Attributes:
        protocol: the fsspec protocol of a remote location (lower case), or None for a
            local folder.
        uri: the remote URI (`protocol://rest`, no trailing slash), or None.
        local: the local folder as given (`file://` stripped), or None.
    """

    protocol: str | None
    uri: str | None
    local: str | None


def _text(directory: str | os.PathLike[str]) -> str:
    text = os.fspath(directory)
    return os.fsdecode(text) if isinstance(text, bytes) else text


def _implementation(protocol: str, text: str) -> Any:
    """fsspec's class for `protocol`; a `ConfigError` if it is unknown or not installed."""
    import fsspec

    try:
        return fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ConfigError(
            f"`Checkpoint.directory` uses the protocol {protocol!r}, which fsspec does not know. "
            f"Received: directory={text!r}. Use a local folder or an fsspec URI such as "
            "'s3://bucket/run', 'gs://bucket/run' or 'memory://run'."
        ) from None
    except ImportError as exc:
        extra = _EXTRAS.get(protocol)
        fix = (
            f"pip install 'pipekit-train-core[{extra}]'"
            if extra
            else "install the package fsspec names above"
        )
        raise ConfigError(
            f"`Checkpoint.directory` needs fsspec's {protocol!r} implementation, which is not "
            f"installed ({exc or 'import failed'}). Received: directory={text!r}. "
            f"Install it: {fix}."
        ) from None


def _check_storage_options(storage_options: Any, *, remote: bool, text: str) -> None:
    if storage_options is None:
        return
    if not isinstance(storage_options, Mapping) or not all(
        isinstance(k, str) for k in storage_options
    ):
        raise ConfigError(
            "`Checkpoint.storage_options` must be a dict of fsspec options (e.g. "
            "{'client_kwargs': {'endpoint_url': ...}}) or None. "
            f"Received: storage_options of type {type(storage_options).__name__}."
        )
    if storage_options and not remote:
        raise ConfigError(
            "`Checkpoint.storage_options` only apply to a URI location (s3://, gs://, ...), "
            f"but the directory is a local folder. Received: directory={text!r}. "
            "Drop storage_options, or use a URI."
        )


def parse_location(
    directory: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> Location:
    """Validate a checkpoint location; touch no storage.

    Raises:
        ConfigError: a URI whose protocol fsspec does not know or cannot import, a URI
            mangled by `pathlib.Path` (`s3:/bucket`), a URI without a path, a chained
            URL, or `storage_options` that are not a dict or are given for a local path.
    """
    text = _text(directory)
    if "::" in text.split("/", 1)[0]:
        raise ConfigError(
            "`Checkpoint.directory` must be a local folder or a single fsspec URI; chained "
            f"URLs ('a::b://...') are not supported. Received: directory={text!r}."
        )
    match = _URI.match(text)
    if match is None:
        _check_storage_options(storage_options, remote=False, text=text)
        return Location(protocol=None, uri=None, local=text)
    protocol = match.group(1).lower()
    rest = text[match.end() :]
    if not isinstance(directory, str) or not rest.startswith("/"):
        raise ConfigError(
            "`Checkpoint.directory` looks like a URI whose '//' was collapsed (as "
            f"`pathlib.Path` does). Received: directory={text!r}. Pass the URI as a string, "
            f"e.g. '{protocol}://{rest.lstrip('/')}'."
        )
    rest = rest[1:]  # after `scheme://`
    cls = _implementation(protocol, text)
    from fsspec.implementations.local import LocalFileSystem

    if protocol in _LOCAL or issubclass(cls, LocalFileSystem):
        _check_storage_options(storage_options, remote=False, text=text)
        return Location(protocol=None, uri=None, local=rest or "/")
    path = rest.strip("/")
    if not path:
        raise ConfigError(
            "`Checkpoint.directory` must name a bucket or folder after the protocol. "
            f"Received: directory={text!r}. Use e.g. '{protocol}://bucket/run'."
        )
    _check_storage_options(storage_options, remote=True, text=text)
    return Location(protocol=protocol, uri=f"{protocol}://{path}", local=None)


# fsspec filesystems whose `pipe_file(mode="create")` is one conditional request (the
# in-process memory filesystem: one check under the GIL), by class name
_CONDITIONAL_CREATE = ("S3FileSystem", "GCSFileSystem", "MemoryFileSystem")


def check_lease_store(location: Location, lease_timeout: float | None) -> None:
    """Refuse a URI whose filesystem cannot create a file only if it does not exist, which
    the run lease needs (`lease_timeout` not None); touch no storage.

    Raises:
        ConfigError: the filesystem has no conditional create.
    """
    if lease_timeout is None or location.uri is None or location.protocol is None:
        return
    cls = _implementation(location.protocol, location.uri)
    if any(c.__name__ in _CONDITIONAL_CREATE for c in cls.__mro__):
        return
    raise ConfigError(
        "`Checkpoint.lease_timeout` needs a store that creates a file only if it does not "
        f"exist, in one conditional request, and fsspec's {cls.__name__} cannot. Received: "
        f"directory={location.uri!r}, lease_timeout={lease_timeout!r}. Use a local or shared "
        "folder, s3:// or gs://, or pass lease_timeout=None if you make sure that only one "
        "run at a time writes there."
    )
