"""Content digests of Orbax step directories: core's step-folder digests.

`seal(folder, step)` writes `pipekit-digest.json` into a committed step directory, last
and atomically; `check(folder)` says what is wrong with a step (`None` when intact). The
implementation is core's (`pipekit_train.core.adapter.seal_folder`/`check_folder`), so
the `pipekit-train checkpoint inspect` command verifies Orbax steps exactly as a resume does.
"""

from __future__ import annotations

from pipekit_train.core.adapter import FOLDER_DIGEST as DIGEST
from pipekit_train.core.adapter import check_folder as check
from pipekit_train.core.adapter import seal_folder as seal

__all__ = ["DIGEST", "check", "seal"]
