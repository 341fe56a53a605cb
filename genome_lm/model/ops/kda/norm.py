"""KDA's gated output norm as one op that keeps only its compute-dtype inputs for backward.

Upstream's `o_norm` (`Glm5NextTextRMSNormGated`, reference `upstream_gated_rms_norm`) computes
`weight · rmsnorm(o) · sigmoid(gate)` in float32 per head and keeps four float32 [B, T, H, V]
tensors. `KDAOutputNorm` computes the same keeping o and the gate in the compute dtype: fla's
`rms_norm_gated` on the fla backend (it also keeps a float32 rstd per row), else
`ops.norm.gated_rms_norm` (torch, row statistics recomputed in backward).
"""

from __future__ import annotations

import torch

from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.kda._fla import FLA, FlaKernels, fla_rms_norm_gated, use_fla
from genome_lm.model.ops.norm import gated_rms_norm
from genome_lm.model.upstream import glm
from genome_lm.settings import DEFAULTS, KDABackend


class KDAOutputNorm(LongContextModule, glm.Glm5NextTextRMSNormGated):
    """`Glm5NextTextRMSNormGated`: forward(o [..., V], gate [..., V]) -> [..., V] in o's dtype."""

    upstream = glm.Glm5NextTextRMSNormGated
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
