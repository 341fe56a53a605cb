"""The long-context model is a drop-in for upstream's: called as upstream is called (the default
config has use_cache=True), decoding from a transformers Cache, and greedy `generate`."""

import copy

import pytest
import torch
from transformers import DynamicCache

from genome_lm.model import apply_long_context, use_torch_fallbacks
from tests.helpers import tiny_model

TOL = 1e-5


@pytest.fixture(scope="module")
def pair():
    ref = tiny_model().eval()
    mine = apply_long_context(copy.deepcopy(ref), dsa_block_queries=16, kda_chunk_size=16).eval()
    return ref, mine


def _ids(B: int, T: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 16, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_called_as_upstream_with_the_default_cache(pair):
    ref, mine = pair
    assert mine.config.use_cache  # model(input_ids=x) makes and fills a DynamicCache
    x = _ids(2, 45, 1)
    with use_torch_fallbacks():
        want = ref.model(input_ids=x)
    got = mine.model(input_ids=x)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=TOL, atol=TOL)
    assert got.cache.get_seq_length() == want.cache.get_seq_length() == 45


@torch.no_grad()
def test_cached_pieces_equal_one_pass(pair):
    _, mine = pair
    x = _ids(1, 70, 2)
    whole = mine.hidden(x)  # no cache
    cache = DynamicCache(config=mine.config)
    pieces = [mine.model(input_ids=x[:, a:b], cache=cache, use_cache=True).last_hidden_state
              for a, b in [(0, 17), (17, 18), (18, 19), (19, 70)]]  # pieces cross k-pools (4) and the conv
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=TOL, atol=TOL)


def test_generate_gives_upstreams_greedy_tokens(pair):
    ref, mine = pair
    prompt = _ids(2, 37, 3)
    with use_torch_fallbacks():
        want = ref.generate(prompt, max_new_tokens=12)
    got = mine.generate(prompt, max_new_tokens=12)
    assert got.shape == (2, 49) and torch.equal(got[:, :37], prompt)
    assert torch.equal(got, want)
    ids = prompt  # the same tokens without a cache: the whole prefix scored again for each token
    with torch.no_grad():
        for _ in range(12):
            ids = torch.cat([ids, mine.logits(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(got, ids)
