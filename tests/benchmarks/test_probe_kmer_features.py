"""`benchmarks/probe_kmer_features.py`: its linear read-out finds a base where the residual stream
holds it and only there (so its table says what a layer carries, not what the probe invents)."""

import pytest
import torch

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def probe():
    return load_benchmark("probe_kmer_features")


def test_read_out_finds_a_base_exactly_where_the_features_hold_it(probe):
    torch.manual_seed(0)
    x = torch.randint(0, 4, (probe.BATCH, probe.SEQ))
    noise = torch.randn(probe.BATCH, probe.SEQ, 12)
    previous = torch.nn.functional.one_hot(torch.roll(x, 2, dims=1), 4).float()  # the base 2 back, one-hot
    features = torch.cat([noise, previous], dim=-1)
    assert probe.probe_accuracy(features, x, 2) == 1.0
    for offset in (0, 1, 3):
        assert probe.probe_accuracy(features, x, offset) < 0.35  # chance is 0.25


def test_untrained_demo_model_carries_the_bases_its_convolution_sees(probe):
    from genome_lm.model import apply_long_context, build

    torch.manual_seed(0)
    model = apply_long_context(build("glm53-demo", dtype="float32").model).eval()
    x = torch.randint(0, 4, (probe.BATCH, probe.SEQ))
    streams = dict(probe.residual_streams(model, x))
    assert list(streams)[:2] == ["embedding", "layer 0 (KDA)"]
    assert probe.probe_accuracy(streams["embedding"], x, 1) < 0.35  # the token itself, nothing before it
    kda = streams["layer 0 (KDA)"]
    assert min(probe.probe_accuracy(kda, x, i) for i in (1, 4, 7)) > 0.6  # the short convolution's taps
    assert probe.probe_accuracy(kda, x, 9) < 0.45  # and not beyond them (width 8: bases 0 .. -7)
