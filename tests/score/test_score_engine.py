"""`score.engine.stream` equals one parallel forward, whatever the chunk size: the exactness guarantee of
`genome-lm score`.

Per-base log p(observed), log p(A, C, G, T) and the residual stream after two decoder layers, on both
strands (the sequence and its reverse complement), from `stream` in chunks against one
`Glm5NextCausalLM.forward` over the whole sequence (glm53-tiny: its six layers are the real
architecture's KDA, full and shared DSA, MoE and hyper-connections). float32: within 1e-4 relative
(`assert_close`; observed about 1e-6). bfloat16: within BF16 = 1e-3 relative of the bfloat16 forward
(observed: equal bit for bit on CPU). That needs chunks of whole KDA blocks (64 tokens; `--chunk` is
refused otherwise): a chunk of 500 moves bf16 log-probs by up to 0.3 relative, as the KDA blocks then
start elsewhere, bf16 rounds differently and DSA's top-k picks other pools. The guarantee needs every
carried state: resetting the DSA caches between chunks breaks it by far.

Lengths: the default test scores 2,500 tokens in chunks of 1k and 320 (chunks end inside DSA blocks of
256 queries; the last chunk is short); the slow one 69,755 tokens in chunks of 1k, 4k and 64k (64k is a
real chunk there: two chunks, the second 4,219 tokens).
"""

import pytest
import torch

from genome_lm.genome.tokenizer import reverse_complement
from genome_lm.model import apply_long_context
from genome_lm.model.streaming import StreamingCache, StreamingScorer
from genome_lm.score.engine import captured, log_probs, stream
from tests.helpers import assert_close, tiny_model

FP32 = 1e-4
BF16 = 1e-3
LAYERS = [1, 4]  # a KDA layer and the shared DSA layer
COLS = torch.arange(4)  # glm53-tiny: model ids = shard ids, A C G T = 0 1 2 3

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(dtype=torch.float32):
    model = tiny_model(1, initializer_range=0.1)  # peakier predictions: attention matters
    apply_long_context(model, dsa_block_queries=256)
    return model.to(dtype).eval()


def sequence(T: int) -> torch.Tensor:
    return torch.randint(0, 4, (T,), generator=torch.Generator().manual_seed(T))


@torch.no_grad()
def full_forward(model, ids) -> dict:
    """logp [T - 1], logp_acgt [T - 1, 4], embeddings {layer: [T, D]} of one forward over all of `ids`."""
    with captured(model, LAYERS) as emb:
        out = model(ids[None], return_per_token_nll=True, return_hidden=True)
    logp, acgt = log_probs(out.hidden_states[0, :-1], model.lm_head.weight, COLS, ids[1:], 4096)
    assert_close("log p(observed): per_token_nll vs log_probs", logp, -out.per_token_nll[0, 1:], FP32)
    return {"logp": logp, "acgt": acgt, **{i: e[0] for i, e in emb.items()}}


def streamed(model, ids, chunk: int) -> dict:
    chunks = list(stream(model, ids, COLS, chunk, LAYERS))
    assert [c.start for c in chunks] == list(range(0, len(ids), chunk))
    logp = torch.cat([c.logp for c in chunks])
    assert torch.isnan(logp[0]) and not torch.isnan(logp[1:]).any()  # nothing precedes the first base
    return {"logp": logp[1:], "acgt": torch.cat([c.logp_acgt for c in chunks])[1:],
            **{i: torch.cat([c.embeddings[i] for c in chunks]) for i in LAYERS}}


def assert_equal_to_forward(model, T: int, chunks: tuple[int, ...], tol: float = FP32) -> None:
    for strand, ids in (("+", sequence(T)), ("-", torch.from_numpy(reverse_complement(sequence(T).numpy())).long())):
        ref = full_forward(model, ids)
        for chunk in chunks:
            got = streamed(model, ids, chunk)
            for name in ref:
                assert_close(f"{name}, strand {strand}, chunks of {chunk}", got[name], ref[name], tol)


def test_chunks_equal_one_forward():
    assert_equal_to_forward(tiny(), 2500, (1024, 320))


@pytest.mark.slow
def test_chunks_of_1k_4k_64k_equal_one_forward():
    assert_equal_to_forward(tiny(), 64 * 1024 + 4219, (1024, 4096, 64 * 1024))


def test_bf16_within_its_tolerance():
    assert_equal_to_forward(tiny(torch.bfloat16), 1200, (256, 512), BF16)


def test_not_carrying_the_dsa_cache_breaks_it(monkeypatch):
    """Each chunk starting with empty DSA caches (the KDA states still carried) is far outside FP32."""
    step = StreamingScorer.hidden_step

    def forgetful(self, input_ids):
        hidden = step(self, input_ids)
        fresh = StreamingCache(self.model.config, self.cache.total_len)
        for i, kind in enumerate(self.model.config.layer_types):
            if kind != "linear_attention":
                self.cache.layers[i] = fresh.layers[i]
        return hidden

    monkeypatch.setattr(StreamingScorer, "hidden_step", forgetful)
    with pytest.raises(AssertionError, match="chunks of 512"):
        assert_equal_to_forward(tiny(), 1500, (512,))
