"""Fencing: which checkpoint steps a run may resume, by the lease generation that wrote them.

Every taking of a location's run lease raises its generation (a fencing token), and every
step a holder commits records the generation that wrote it (in `MANIFEST.json` or
`pipekit-digest.json`). When generation `G` is taken, the newest step committed at that
moment, `S`, is recorded in its lease record as the fence `(G, S)`: from then on, a step
of an older generation numbered above `S` can only have been written by a holder that had
already lost the location (it stalled past the lease time and woke to finish a save). Such
a step is *void*: never resumed, and removed by the current holder.

The fences of every generation travel in the newest lease record; they are kept as a
staircase (a fence `(G1, S1)` is dropped when a later `(G2, S2)` has `S2 <= S1`, which
already voids everything the first one did).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Fencing", "add_fence"]


def add_fence(
    fences: Iterable[tuple[int, int]], generation: int, step: int
) -> tuple[tuple[int, int], ...]:
    """`fences` with `(generation, step)` added, as a staircase (steps rising with the
    generation)."""
    out = [(int(g), int(s)) for g, s in fences if int(g) < generation]
    out.append((int(generation), int(step)))
    out.sort()
    kept: list[tuple[int, int]] = []
    for g, s in reversed(out):  # newest first: keep a fence only if it is stricter
        if not kept or s < kept[-1][1]:
            kept.append((g, s))
    return tuple(reversed(kept))


@dataclass(frozen=True)
class Fencing:
    """What a process knows of a location's generations.

    Attributes:
        generation: the generation this process holds on the location (its commits
            record it), or None (no lease held here: a reader, a non-chief process).
        fences: `(generation, step)` pairs: steps of older generations numbered above
            `step` are void.
    """

    generation: int | None = None
    fences: tuple[tuple[int, int], ...] = ()

    def void(self, step: int, written_by: int | None) -> tuple[int, int] | None:
        """The fence that voids step `step` written by generation `written_by` (None: a
        step without a generation, from a run without a lease), or None when it is valid."""
        g = 0 if written_by is None else int(written_by)
        for fence_gen, fence_step in self.fences:
            if fence_gen > g and step > fence_step:
                return (fence_gen, fence_step)
        return None

    def newer(self, written_by: int | None) -> bool:
        """Whether a step written by `written_by` comes from a newer holder than this
        process's (so this process lost the location)."""
        return (
            self.generation is not None and written_by is not None and written_by > self.generation
        )
