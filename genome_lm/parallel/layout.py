"""How the processes of a launch split into dp x cp: the one resolver of training, eval
(`eval/sharded.py`) and the planner (`plan/layout.py`), each refusing in its own words (`LayoutWords`).

    dp, cp = resolve_layout(cp=2, dp="auto", world=8)                # (4, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from genome_lm.errors import GenomeLMError


@dataclass(frozen=True)
class LayoutWords:
    """The refusals of `resolve_layout`, as `str.format` templates over cp, dp, world, need (dp x cp),
    lower / upper (the multiples of cp on either side of world) and nproc ("add --nproc" for one
    process, else "launch with --nproc")."""

    no_world: str  # world < 1
    too_few: str  # cp > world
    not_divisor: str  # cp does not divide world
    dp_mismatch: str  # dp x cp != world


RUN_WORDS = LayoutWords(
    no_world="the number of processes must be >= 1, got {world}",
    too_few="parallel.cp={cp} needs at least {cp} processes, this launch has {world}; launch with --nproc {cp} "
            "(or a multiple of it) or lower parallel.cp",
    not_divisor="parallel.cp={cp} does not divide the {world} processes of this launch; use a number of processes "
                "that is a multiple of {cp}",
    dp_mismatch="parallel.dp={dp} x parallel.cp={cp} = {need} processes, but this launch has {world}; set "
                "parallel.dp: auto or launch {need} processes",
)


def resolve_layout(cp: int, dp: int | Literal["auto"], world: int, words: LayoutWords = RUN_WORDS) -> tuple[int, int]:
    """(dp, cp) of `world` processes given cp and dp (a number, or "auto": world / cp); GenomeLMError
    in `words` if they do not fit."""

    def refuse(template: str) -> GenomeLMError:
        need = int(dp) * cp if dp != "auto" else world
        nproc = "add --nproc" if world == 1 else "launch with --nproc"
        return GenomeLMError(template.format(cp=cp, dp=dp, world=world, need=need, lower=world - world % cp,
                                            upper=-(-world // cp) * cp, nproc=nproc))

    if world < 1:
        raise refuse(words.no_world)
    if dp != "auto" and int(dp) * cp != world:  # the one count that fits: dp x cp
        raise refuse(words.dp_mismatch)
    if cp > world:
        raise refuse(words.too_few)
    if world % cp:
        raise refuse(words.not_divisor)
    return (world // cp if dp == "auto" else int(dp)), cp
