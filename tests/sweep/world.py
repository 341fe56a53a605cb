"""The inputs every sweep case shares, built once: `World.build(root)`."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

SCORE = ["--max-windows", "2", "--seq-len", "512", "--resamples", "50"]  # how the world's evals score


def quiet_main(argv: list[str]) -> None:
    """`genome-lm ARGV`, which must succeed; its output is dropped."""
    from genome_lm.cli import main

    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    assert code == 0, f"genome-lm {' '.join(argv)} exited {code}: {err.getvalue()[-2000:]}"


@dataclass(frozen=True)
class World:
    root: Path
    fasta: Path  # the synthetic genome (scale 0.05, seed 3)
    shards: Path  # its shards: chr1, chr2 train, chr22 eval, 4k windows
    fasta_b: Path  # another genome (seed 4)
    shards_b: Path  # its shards, prepared alike
    exp: Path  # a glm53-tiny experiment of 2 steps on `shards`
    run: Path  # that experiment trained
    ev: Path  # its last checkpoint scored on `shards` (SCORE)
    ev_b: Path  # and on `shards_b`
    cmp: Path  # compare ev ev
    html: Path  # report of ev
    srv: Path  # a download server's folder (--base-url file://SRV): md5sum.txt and chr22.fa.gz

    @property
    def ckpt(self) -> Path:
        return self.run / "checkpoints" / "last"

    def paths(self) -> dict[str, str]:
        return {k: str(getattr(self, k)) for k in (*self.__dataclass_fields__, "ckpt")}

    @classmethod
    def build(cls, root: Path) -> "World":
        from tests.helpers import make_shards, write_experiment

        os.environ.setdefault("TQDM_DISABLE", "1")
        logging.disable(logging.WARNING)
        try:
            shards, shards_b = make_shards(root / "a"), make_shards(root / "b", seed=4)
            exp = Path(write_experiment(root / "exp.yaml", shards, train={"steps": 2, "checkpoint_every": 2}))
            w = cls(root, root / "a" / "genome.fa.gz", shards, root / "b" / "genome.fa.gz", shards_b, exp,
                    root / "run", root / "ev", root / "ev_b", root / "cmp", root / "report.html", root / "srv")
            quiet_main(["train", str(exp), "--out", str(w.run)])
            quiet_main(["eval", "--checkpoint", str(w.ckpt), "--shards", str(shards), "--out", str(w.ev), *SCORE])
            quiet_main(["eval", "--checkpoint", str(w.ckpt), "--shards", str(shards_b), "--out", str(w.ev_b),
                        *SCORE])
            quiet_main(["compare", str(w.ev), str(w.ev), "--out", str(w.cmp)])
            quiet_main(["report", str(w.ev), "--out", str(w.html)])
        finally:
            logging.disable(logging.NOTSET)
        w.srv.mkdir()
        shutil.copy(w.fasta, w.srv / "chr22.fa.gz")
        (w.srv / "md5sum.txt").write_text(f"{hashlib.md5(w.fasta.read_bytes()).hexdigest()}  chr22.fa.gz\n")
        return w

    @classmethod
    def kept(cls, root: Path) -> "World":
        """The world built in `root` before (`build` there first), its cases' folder emptied."""
        fields = [f for f in cls.__dataclass_fields__ if f != "root"]
        if not (root / "world.json").is_file():
            root.mkdir(parents=True, exist_ok=True)
            w = cls.build(root)
            (root / "world.json").write_text(json.dumps({f: str(getattr(w, f)) for f in fields}))
        w = cls(root, **{k: Path(v) for k, v in json.loads((root / "world.json").read_text()).items()})
        shutil.rmtree(root / "cases", ignore_errors=True)
        (root / "cases").mkdir()
        return w
