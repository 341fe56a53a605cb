"""KDA's gated output norm keeping only compute-dtype inputs. Upstream's `o_norm` computes
`weight · rmsnorm(o) · sigmoid(gate)` in float32 per head, keeping four float32 [B, T, H, V] tensors;
`KDAOutputNorm` keeps o and the gate: fla's `rms_norm_gated` (plus a float32 rstd per row) on the fla
backend, else `ops.norm.gated_rms_norm` (row statistics recomputed in backward)."""

from __future__ import annotations

import torch

from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.kda._fla import FLA, FlaKernels, fla_rms_norm_gated, use_fla
from genome_lm.model.ops.norm import gated_rms_norm
from genome_lm.model.upstream import glm
from genome_lm.settings import DEFAULTS, KDABackend


class KDAOutputNorm(LongContextModule, glm.Glm5NextTextRMSNormGated):
    """`Glm5NextTextRMSNormGated`: forward(o [..., V], gate [..., V]) -> [..., V] in o's dtype."""

    backend: KDABackend = DEFAULTS.kda_backend
    fla: FlaKernels = FLA

    def configure(self, backend: KDABackend = DEFAULTS.kda_backend, fla: FlaKernels = FLA) -> None:
        if self.activation != "sigmoid":
            raise NotImplementedError(f"KDA output norm with a {self.activation!r} gate; only sigmoid")
        self.backend, self.fla = backend, fla

    def extra_repr(self) -> str:
        return ", ".join(filter(None, [super().extra_repr(), f"backend={self.backend}"]))

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if use_fla(hidden_states.device.type, self.backend, self.fla):
            return fla_rms_norm_gated(self.fla)(x=hidden_states, g=gate, weight=self.weight, bias=None,
                                                activation="sigmoid", eps=self.variance_epsilon)
        assert gate is not None  # LongKDA passes its output gate
        return gated_rms_norm(hidden_states, gate, self.weight, self.variance_epsilon)
