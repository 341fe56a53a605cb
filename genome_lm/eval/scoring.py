"""Per-token scoring of one window, with the parallel (training) forward or the streaming engine.

A window of L tokens is scored in consecutive pieces of at most `seq_len` tokens. Each piece
is an independent forward pass: the model's context restarts at the start of every piece, so
the preceding context of a token is its position within its piece (`buckets.contexts_of`).
With the default `seq_len` = the whole window there is one piece and context = position.

Labels follow the trainer (`genome_lm.train.data`): a token is not scored when it is an N
base, when its shard id has no model id (a token map that does not cover it), or when it
starts a piece (nothing precedes it). The result is NLL float32 [L], NaN where not scored.

Engines:
- "parallel": `model(input_ids [1, T], labels, return_per_token_nll=True)`: the chunked
  LM head + loss of training, no gradients.
- "streaming": `genome_lm.model.streaming.score_streaming(model, input_ids [1, T],
  chunk_tokens)` -> NLL [T], carrying the recurrent state and caches from chunk to chunk.
"""

from __future__ import annotations

import numpy as np
import torch

from genome_lm.errors import GenomeLMError
from genome_lm.genome.tokenizer import IGNORE_INDEX, N_ID
from genome_lm.settings import STREAMING_CHUNK_TOKENS

ENGINES = ("parallel", "streaming")


def piece_inputs(piece: np.ndarray, lut: np.ndarray, n_known: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Shard ids uint8 [T] -> (input_ids, labels) int64 [1, T] in the model vocabulary.

    `lut` [256] maps shard ids to model ids; ids >= `n_known` are not covered by the token map:
    they are fed as N and, like N itself, get label -100.
    """
    ids = piece.astype(np.int64)
    known = ids < n_known
    ids = np.where(known, ids, N_ID)
    model_ids = lut[ids]
    labels = np.where(known & (ids != N_ID), model_ids, IGNORE_INDEX)
    return torch.from_numpy(model_ids)[None], torch.from_numpy(labels)[None]


@torch.no_grad()
def score_piece(model, input_ids: torch.Tensor, labels: torch.Tensor, engine: str = "parallel",
                chunk_tokens: int = STREAMING_CHUNK_TOKENS) -> np.ndarray:
    """NLL float32 [T] of one piece (input_ids, labels [1, T]); NaN where not scored."""
    device = model.device
    input_ids = input_ids.to(device)
    if engine == "parallel":
        out = model(input_ids, labels=labels.to(device), return_per_token_nll=True)
        nll = out.per_token_nll[0].float().cpu().numpy()
        mask = out.nll_mask[0].cpu().numpy()
    elif engine == "streaming":
        from genome_lm.model.streaming import score_streaming

        nll = score_streaming(model, input_ids, chunk_tokens).float().reshape(-1).cpu().numpy()
        mask = labels[0].numpy() != IGNORE_INDEX
        mask[0] = False
    else:
        raise GenomeLMError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    return np.where(mask, nll, np.nan).astype(np.float32)


def score_window(model, tokens: np.ndarray, lut: np.ndarray, n_known: int, seq_len: int,
                 engine: str = "parallel", chunk_tokens: int = STREAMING_CHUNK_TOKENS) -> np.ndarray:
    """NLL float32 [L] of a window of shard ids uint8 [L], scored in pieces of `seq_len`."""
    out = np.empty(len(tokens), dtype=np.float32)
    for start in range(0, len(tokens), seq_len):
        piece = tokens[start : start + seq_len]
        ids, labels = piece_inputs(piece, lut, n_known)
        out[start : start + len(piece)] = score_piece(model, ids, labels, engine, chunk_tokens)
    return out
