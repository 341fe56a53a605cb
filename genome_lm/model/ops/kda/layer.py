"""Upstream's KDA layer (`Glm5NextTextLinearAttention`) running on `chunk_kda` through `kda_layer_step`
(`step.py`), so activations stay O(T·H·K).

Upstream, per layer (B batch, T tokens, D model dim, H heads, K = V head dim, W conv width):
    qkv  = silu(causal depthwise conv_W([q_proj | k_proj | v_proj](x)))  # [B, T, 3·H·K]
    g    = forget_gate(x)        # log decay in [lower_bound, 0), [B, T, H, K], fp32
    beta = sigmoid(b_proj(x))    # [B, T, H]
    o    = KDA(l2norm(q), l2norm(k), v, g, beta)                          # [B, T, H, V]
    out  = o_proj(o_norm(o, gate=g_b_proj(g_a_proj(x))))                  # [B, T, D]

The conv + SiLU, forget gate and gated output norm are each one op that keeps its compute-dtype
inputs and recomputes the rest (`conv.py`, `gate.py`, `norm.py`, fla's kernels on CUDA); the gate is
applied inside the recurrent op, as fla's `use_gate_in_kernel` does."""

import torch

from genome_lm.model.cp import CPContext
from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.kda._fla import FLA, FlaKernels
from genome_lm.model.ops.kda.conv import KDAShortConv
from genome_lm.model.ops.kda.cp import cp_kda_forward
from genome_lm.model.ops.kda.gate import KDAForgetGate
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.ops.kda.step import KDAState, conv_state_before, kda_layer_step, kda_projections, mask_padding
from genome_lm.model.upstream import Glm5NextTextLinearAttention
from genome_lm.settings import DEFAULTS, KDABackend


class LongKDA(LongContextModule, Glm5NextTextLinearAttention):
    """`Glm5NextTextLinearAttention` on `chunk_kda` (parameters and names upstream's).

    Settings: `chunk_size`, `head_block`, `backend` and `fla` of `chunk_kda`; `cp`, a `CPContext` once
    `apply_context_parallel` ran (then the layer runs its rank's slab, `cp.py`). Installing it also
    installs `conv1d` -> `KDAShortConv` (upstream never calls `conv1d`'s forward: its causal conv
    reads the weight), `forget_gate` -> `KDAForgetGate`, `o_norm` -> `KDAOutputNorm`.
    """

    upstream = Glm5NextTextLinearAttention
    chunk_size: int = DEFAULTS.kda_chunk_size
    head_block: int = DEFAULTS.kda_head_block
    backend: KDABackend = DEFAULTS.kda_backend
    fla: FlaKernels = FLA
    cp: CPContext | None = None
    # the parts `configure` installs
    conv1d: KDAShortConv
    forget_gate: KDAForgetGate
    o_norm: KDAOutputNorm

    def configure(self, chunk_size: int = DEFAULTS.kda_chunk_size, head_block: int = DEFAULTS.kda_head_block,
                  backend: KDABackend = DEFAULTS.kda_backend, fla: FlaKernels = FLA) -> None:
        if chunk_size < 1:
            raise ValueError(f"kda chunk_size must be >= 1, got {chunk_size}")
        if head_block < 0 or (head_block and self.num_heads % head_block):
            raise ValueError(f"kda head_block={head_block} must be 0 (all heads) or divide the {self.num_heads} heads")
        self.chunk_size = int(chunk_size)
        self.head_block = int(head_block)
        self.backend, self.fla = backend, fla
        KDAShortConv.install(self.conv1d, activation=self.activation, backend=backend, fla=fla)
        KDAForgetGate.install(self.forget_gate)
        KDAOutputNorm.install(self.o_norm, backend=backend, fla=fla)

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}, head_block={self.head_block}, cp={self.cp}"

    def forward(self, hidden_states: torch.Tensor, cache=None, attention_mask: torch.Tensor | None = None,
                **kwargs) -> torch.Tensor:
        """Upstream's call: hidden_states [B, T, D] -> [B, T, D]; a transformers `cache` is updated as
        upstream updates it; other kwargs are ignored (packed sequences are refused)."""
        if kwargs.get("cu_seqlens") is not None or kwargs.get("seq_idx") is not None:
            raise NotImplementedError("genome_lm's KDA does not support packed sequences (cu_seqlens / seq_idx)")
        if self.cp is not None:
            if cache is not None:
                raise NotImplementedError("context-parallel KDA is for training (no cache); score with one process")
            return cp_kda_forward(self, hidden_states, attention_mask)
        if cache is None:
            return kda_layer_step(self, hidden_states, None, attention_mask)[0]

        return self._cached_forward(hidden_states, cache, attention_mask)

    def _cached_forward(self, hidden_states: torch.Tensor, cache, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Upstream's cache path on `kda_layer_step`. The cache gets the T raw projections
        (`update_conv_state`: it counts them, and keeps them while recording for a `crop`); when it
        asks for the states after each of its last N tokens, those run one at a time after the rest."""

        idx = self.layer_idx
        hidden_states = mask_padding(hidden_states, attention_mask)
        B, T, _ = hidden_states.shape
        recurrent = cache.get_recurrent_state(idx)  # read first: updating the conv state marks the layer started
        mixed = kda_projections(self, hidden_states)  # [B, T, 3·H·K]
        full = cache.update_conv_state(mixed.transpose(1, 2).detach(), idx, conv_kernel_size=self.conv_kernel_size)
        if recurrent is None:
            recurrent = mixed.new_zeros(B, self.num_heads, self.head_dim, self.head_dim, dtype=torch.float32)
        state = KDAState(conv_state_before(full, T, self.conv_kernel_size), recurrent)

        keep = min(cache.get_recurrent_states_to_keep(idx), T)
        bounds = ([0] if keep < T else []) + list(range(T - keep, T + 1))  # [0, T-N, T-N+1, ..., T]
        outs, kept = [], []
        for start, end in zip(bounds[:-1], bounds[1:]):
            out, state = kda_layer_step(self, hidden_states[:, start:end], state, mixed=mixed[:, start:end])
            assert state.recurrent_state is not None  # the default core, chunk_kda, returns the final state
            final = state.recurrent_state.detach()
            outs.append(out)
            if start >= T - keep:
                kept.append(final)
        cache.update_recurrent_state(kept if keep else final, idx)
        return torch.cat(outs, dim=1)
