"""Training sequences from prepared shards: deterministic order, resumable position. Every window is cut into
consecutive pieces of at most `seq_len` tokens (the tail piece shorter, dropped if under `min_piece`). Each epoch
visits all pieces in an order drawn from (seed, epoch); the position (epoch, index) is the whole state. Batches hold
`input_ids` [B, T] (model vocabulary, via the token map) and `labels` [B, T] (the same ids, shifted in the model;
-100 where there is no target: N bases when `ignore_n`, and padding)."""

from __future__ import annotations

import logging

import numpy as np
import torch

from genome_lm.errors import GenomeLMError
from genome_lm.genome.shards import load_shards
from genome_lm.genome.tokenizer import IGNORE_INDEX, N_ID

log = logging.getLogger(__name__)


class SequenceStream:
    def __init__(self, shards: str, split: str, seq_len: int, *, seed: int = 0, reverse_complement: bool = True,
                 min_piece: int = 64, ignore_n: bool = True, token_map: np.ndarray | None = None):
        self.ds = load_shards(shards, split)
        ends, starts = np.asarray(self.ds["end"]), np.asarray(self.ds["start"])
        rows = np.arange(len(self.ds))
        if not reverse_complement:
            rows = rows[np.asarray(self.ds["strand"]) == "+"]
        lengths = (ends - starts)[rows].astype(np.int64)
        if len(lengths) and seq_len > lengths.max():
            raise GenomeLMError(
                f"data.seq_len={seq_len:,} is longer than every window of {shards}/{split} (the longest holds "
                f"{int(lengths.max()):,} tokens), so no sequence could have that context; prepare shards with "
                f"--seq-len {seq_len} or longer, or lower data.seq_len"
            )
        counts = -(-lengths // seq_len)  # [W] pieces of each window, the last one shorter
        first = np.repeat(np.cumsum(counts) - counts, counts)  # [P] the first piece of each piece's window
        offsets = (np.arange(len(first), dtype=np.int64) - first) * seq_len
        piece_rows = np.repeat(np.arange(len(lengths)), counts)
        sizes = np.minimum(seq_len, lengths[piece_rows] - offsets)
        keep = sizes >= min(min_piece, seq_len)
        pieces = np.stack([rows[piece_rows[keep]], offsets[keep], sizes[keep]], axis=1)  # [P, 3] row, offset, length
        if len(pieces) == 0:
            raise GenomeLMError(
                f"{shards}/{split}: no training pieces of at least {min_piece} tokens; "
                "lower data.min_piece or data.seq_len"
            )
        self.pieces = pieces
        self.seed = seed
        self.ignore_n = ignore_n
        self.token_map = token_map if token_map is not None else np.arange(256, dtype=np.int64)
        self.epoch, self.index = 0, 0
        self._order = self._permutation(0)
        log.info("%s/%s: %d windows -> %d pieces of <= %d tokens (%s tokens per epoch)", shards, split, len(rows),
                 len(pieces), seq_len, f"{int(pieces[:, 2].sum()):,}")
        short = int((pieces[:, 2] < seq_len).sum())
        if short:
            log.log(logging.WARNING if short > len(pieces) // 4 else logging.INFO,
                    "%d of %d pieces (%.0f%%) are shorter than data.seq_len=%d (window tails of %d-%d tokens): those "
                    "sequences train with less context than asked", short, len(pieces), 100 * short / len(pieces),
                    seq_len, int(pieces[pieces[:, 2] < seq_len, 2].min()), int(pieces[pieces[:, 2] < seq_len, 2].max()))

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.pieces))

    @property
    def tokens_per_epoch(self) -> int:
        return int(self.pieces[:, 2].sum())

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "num_pieces": len(self.pieces)}

    def load_state_dict(self, state: dict) -> None:
        if state["num_pieces"] != len(self.pieces) or state["seed"] != self.seed:
            raise GenomeLMError(
                "the checkpoint's data position does not fit these shards/settings "
                f"({state['num_pieces']} pieces, seed {state['seed']} vs {len(self.pieces)}, {self.seed}); "
                "resume with the same data.shards, data.seq_len and data.seed"
            )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._permutation(self.epoch)

    def next_batch(self, micro_batch: int = 1, part: int = 0, parts: int = 1) -> dict[str, torch.Tensor]:
        """input_ids, labels: int64 [B, T] with T the longest piece of the batch. Data parallel: of
        `micro_batch * parts` pieces drawn, this caller gets those of `part` (the others skipped unread),
        so a run resumes on any number of parts (parts=1, micro_batch=2 reads what parts=2 do)."""
        pieces = []
        for i in range(micro_batch * parts):
            if self.index >= len(self._order):  # the next epoch
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            row, offset, length = self.pieces[self._order[self.index]].tolist()
            self.index += 1
            if i // micro_batch == part:
                pieces.append(self.ds[row]["tokens"][offset : offset + length])
        T = max(len(p) for p in pieces)
        ids = np.full((micro_batch, T), N_ID, dtype=np.int64)
        labels = np.full((micro_batch, T), IGNORE_INDEX, dtype=np.int64)
        for b, p in enumerate(pieces):
            ids[b, : len(p)] = p
            mapped = self.token_map[p]
            labels[b, : len(p)] = np.where(p == N_ID, IGNORE_INDEX, mapped) if self.ignore_n else mapped
        return {"input_ids": torch.from_numpy(self.token_map[ids]), "labels": torch.from_numpy(labels)}
