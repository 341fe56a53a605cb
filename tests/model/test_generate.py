"""The long-context model is a drop-in for upstream's: called as upstream is called (the default
config has use_cache=True), decoding from a transformers Cache, greedy `generate`, and the causal
LM called with the keyword arguments a transformers user passes (or refusing them in one line)."""

import copy

import pytest
import torch
from transformers import DynamicCache

from genome_lm.errors import GenomeLMError
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


@torch.no_grad()
def test_called_with_a_transformers_users_keywords(pair):
    _, mine = pair
    x = _ids(2, 40, 4)
    plain = mine(x, labels=x, return_hidden=True)
    for kwargs in [dict(use_cache=False), dict(use_cache=None), dict(return_dict=True)]:
        out = mine(input_ids=x, labels=x, return_hidden=True, **kwargs)
        assert torch.equal(out.loss, plain.loss) and torch.equal(out.hidden_states, plain.hidden_states)
        assert out.cache is None
    masked = mine(input_ids=x, labels=x, attention_mask=torch.ones_like(x), return_hidden=True)
    torch.testing.assert_close(masked.hidden_states, plain.hidden_states, rtol=TOL, atol=TOL)
    cached = mine(input_ids=x, labels=x, use_cache=True, return_hidden=True)
    assert isinstance(cached.cache, DynamicCache) and cached.cache.get_seq_length() == 40
    torch.testing.assert_close(cached.hidden_states, plain.hidden_states, rtol=TOL, atol=TOL)
    torch.testing.assert_close(cached.loss, plain.loss, rtol=TOL, atol=TOL)
    loss, num_targets = mine(x, labels=x, return_dict=False)
    assert torch.equal(loss, plain.loss) and torch.equal(num_targets, plain.num_targets)


@torch.no_grad()
@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_a_call_continues_the_cache_it_is_given(pair, keyword):
    _, mine = pair
    x = _ids(1, 50, 5)
    whole = mine(x, return_hidden=True).hidden_states
    first = mine(x[:, :23], use_cache=True, return_hidden=True)
    second = mine(x[:, 23:], return_hidden=True, **{keyword: first.cache})
    assert second.cache is first.cache and first.cache.get_seq_length() == 50
    torch.testing.assert_close(torch.cat([first.hidden_states, second.hidden_states], dim=1), whole, rtol=TOL,
                               atol=TOL)


@pytest.mark.parametrize("name, value", [
    ("inputs_embeds", torch.zeros(1, 8, 64)),
    ("position_ids", torch.arange(8)[None]),
    ("output_hidden_states", True),
    ("logits_to_keep", 1),
    ("num_items_in_batch", 8),
])
def test_upstream_keywords_it_does_not_take_are_one_line(pair, name, value):
    _, mine = pair
    x = _ids(1, 8, 6)
    with pytest.raises(GenomeLMError, match=rf"^Glm5NextCausalLM: {name} not supported; it takes input_ids, labels"):
        mine(x, **{name: value})
    with pytest.raises(GenomeLMError, match="not both"):
        mine(x, cache=DynamicCache(config=mine.config), past_key_values=DynamicCache(config=mine.config))
