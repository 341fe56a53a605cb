"""Checkpoint IO through upstream transformers, bad directories, and the shard -> model token map."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.models.glm5_next import Glm5NextConfig, Glm5NextForConditionalGeneration

from genome_lm.errors import GenomeLMError
from genome_lm.model import apply_long_context, build, preset_config, save_pretrained, token_lut, token_map
from genome_lm.model.upstream import Glm5NextTextModel, use_torch_fallbacks
from genome_lm.model.weights import writer as writer_mod
from genome_lm.model.weights.reader import LoadReport
from genome_lm.outputs import MARKER
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

SHARD_VOCAB = {"A": 0, "C": 1, "G": 2, "T": 3, "N": 4}
TINY_VISION = dict(
    depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
    projection_intermediate_size=32, patch_size=2, image_size=8, spatial_merge_size=1, temporal_patch_size=1,
)  # fmt: skip


def _keys(directory: Path) -> set[str]:
    keys = set()
    for f in directory.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            keys.update(st.keys())
    return keys


def test_round_trip_through_upstream_loading(tmp_path):
    model = tiny_model(router_bias=0.05)
    out = save_pretrained(model, tmp_path / "ckpt")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "config.json", "model.safetensors"]
    keys = _keys(out)
    assert "lm_head.weight" in keys and "model.layers.1.mlp.experts.7.down_proj.weight" in keys  # on-disk layout
    assert "model.layers.0.hc_attn_fn" in keys and "model.layers.0.self_attn.q_conv1d.weight" in keys
    assert json.loads((out / "config.json").read_text())["model_type"] == "glm5_next_text"

    x = torch.randint(0, 5, (2, 48))
    upstream = Glm5NextTextModel.from_pretrained(out)  # transformers' own loader and key conversion
    with torch.no_grad(), use_torch_fallbacks():
        expected = model.model(x).last_hidden_state
        assert torch.equal(upstream(x).last_hidden_state, expected)
    with safe_open(str(out / "model.safetensors"), "pt") as st:
        assert torch.equal(st.get_tensor("lm_head.weight"), model.lm_head.weight)

    built = build(out)
    assert built.load_report == LoadReport() and built.source == str(out) and built.dtype == torch.float32
    again = built.model
    ref, got = model.state_dict(), again.state_dict()
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    assert torch.equal(again(x, labels=x).loss, model(x, labels=x).loss)


def test_patched_model_saves_upstream_names(tmp_path):
    model = tiny_model(router_bias=0.05)
    save_pretrained(model, tmp_path / "plain")
    save_pretrained(apply_long_context(model, ops=("moe", "loss")), tmp_path / "patched")
    assert _keys(tmp_path / "plain") == _keys(tmp_path / "patched")


def test_sharded_save_loads_back(tmp_path):
    model = tiny_model(router_bias=0.05)
    out = save_pretrained(model, tmp_path / "sharded", max_shard_bytes=200_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    again = build(out).model
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())
    upstream = Glm5NextTextModel.from_pretrained(out)
    x = torch.randint(0, 5, (1, 20))
    with torch.no_grad():
        assert torch.equal(upstream(x).last_hidden_state, model.model(x).last_hidden_state)


@pytest.fixture
def glm_checkpoint(tmp_path):
    """A full Glm5Next checkpoint as transformers writes it: vision tower, sharded, plus MTP weights."""
    torch.manual_seed(1)
    config = Glm5NextConfig(text_config=preset_config("glm53-tiny").to_dict(), vision_config=TINY_VISION)
    upstream = Glm5NextForConditionalGeneration(config).eval()
    out = tmp_path / "glm"
    upstream.save_pretrained(out, max_shard_size="100KB")
    mtp = {  # next-token-prediction layer beyond the last layer, as in real GLM checkpoints
        "model.language_model.layers.6.eh_proj.weight": torch.zeros(64, 128),
        "model.language_model.layers.6.mlp.experts.0.gate_proj.weight": torch.zeros(32, 64),
        "model.language_model.layers.5.shared_head.norm.weight": torch.zeros(64),
    }
    save_file(mtp, str(out / "model-mtp.safetensors"), metadata={"format": "pt"})
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update(dict.fromkeys(mtp, "model-mtp.safetensors"))
    index_path.write_text(json.dumps(index))
    return upstream, out


def test_loads_text_tower_of_a_full_glm_checkpoint(glm_checkpoint):
    upstream, path = glm_checkpoint
    built = build(path)
    assert built.load_report == LoadReport()  # vision and MTP weights are skipped, not unexpected
    model = built.model
    want = upstream.state_dict()  # its text tensors: model.language_model.* and lm_head.weight
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, want[name.replace("model.", "model.language_model.", 1)]), name
    x = torch.randint(0, 5, (1, 40))
    with torch.no_grad(), use_torch_fallbacks():
        assert torch.equal(model.logits(x), upstream(input_ids=x).logits.float())
    bf16 = build(path, dtype="bfloat16").model
    assert bf16.lm_head.weight.dtype == torch.bfloat16
    assert bf16.model.layers[0].self_attn.conv1d.weight.dtype == torch.float32  # upstream's fp32 list
    meta = build(path, meta=True)
    assert all(p.is_meta for p in meta.model.parameters()) and meta.load_report is None


def test_bad_checkpoint_directories(tmp_path, glm_checkpoint):
    _, good = glm_checkpoint
    with pytest.raises(GenomeLMError, match="neither a preset name nor a directory"):
        build(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GenomeLMError, match="no config.json"):
        build(tmp_path / "empty")

    def copy_config(name, **changes):
        d = tmp_path / name
        d.mkdir()
        config = json.loads((good / "config.json").read_text())
        config.update(changes)
        (d / "config.json").write_text(json.dumps(config))
        return d

    with pytest.raises(GenomeLMError, match="model_type 'llama'"):
        build(copy_config("llama", model_type="llama"))
    pickled = copy_config("pickled")
    torch.save({}, pickled / "pytorch_model.bin")
    with pytest.raises(GenomeLMError, match="never loaded"):
        build(pickled)
    corrupt = copy_config("corrupt")
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(GenomeLMError, match="cannot read"):
        build(corrupt)
    partial = copy_config("partial")
    first = sorted(good.glob("model-0000*.safetensors"))[0]
    (partial / "model.safetensors").write_bytes(first.read_bytes())
    with pytest.raises(GenomeLMError, match="lacks .* weights"):
        build(partial)
    with pytest.raises(GenomeLMError, match="shape"):
        build(good, vocab_size=32)


def test_save_is_atomic(tmp_path, monkeypatch):
    model = tiny_model(router_bias=0.05)
    target = tmp_path / "ckpt"
    save_pretrained(model, target)
    with pytest.raises(GenomeLMError, match="already exists"):
        save_pretrained(model, target)
    save_pretrained(model, target, overwrite=True)

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(writer_mod, "save_file", broken_save)
    with pytest.raises(OSError):
        save_pretrained(model, tmp_path / "never")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no partial directory left
    with pytest.raises(GenomeLMError, match="meta"):
        save_pretrained(build("glm53-tiny", meta=True).model, tmp_path / "meta")


def _tokenizer_dir(path: Path, vocab: dict[str, int]) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    path.mkdir()
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(path / "tokenizer.json"))
    return path


def test_tokenizer_files_come_from_the_directory_named(tmp_path):
    source = save_pretrained(tiny_model(router_bias=0.05), tmp_path / "source")
    (_tokenizer_dir(tmp_path / "tok", {"<unk>": 0, "A": 1}) / "tokenizer.json").rename(source / "tokenizer.json")
    built = build(source)
    with_tokenizer = save_pretrained(built.model, tmp_path / "with", tokenizer_from=built.source)
    assert (with_tokenizer / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert not (save_pretrained(built.model, tmp_path / "without") / "tokenizer.json").exists()


def test_weights_the_model_has_no_place_for_are_reported(tmp_path):
    source = save_pretrained(tiny_model(router_bias=0.05), tmp_path / "source")
    path = source / "model.safetensors"
    with safe_open(str(path), "pt") as st:
        tensors = {key: st.get_tensor(key) for key in st.keys()}
    save_file({**tensors, "model.extra.weight": torch.zeros(2)}, str(path), metadata={"format": "pt"})
    assert build(source).load_report == LoadReport(unexpected=("model.extra.weight",))


def test_token_map(tmp_path):
    assert token_map(SHARD_VOCAB, "glm53-tiny").tolist() == [0, 1, 2, 3, 4]
    assert token_map(SHARD_VOCAB, "glm53-flash").dtype == torch.long
    glm_vocab = {"<unk>": 0, "AC": 1, "G": 3, "N": 5, "A": 7, "C": 9, "T": 12}
    assert token_map(SHARD_VOCAB, _tokenizer_dir(tmp_path / "glm", glm_vocab)).tolist() == [7, 9, 3, 12, 5]
    lut = token_lut(SHARD_VOCAB, tmp_path / "glm")  # every uint8 shard id, 0 past the vocabulary
    assert lut.dtype == np.int64 and lut.tolist() == [7, 9, 3, 12, 5] + [0] * 251
    with pytest.raises(GenomeLMError, match=r"\['N'\]"):
        token_map(SHARD_VOCAB, _tokenizer_dir(tmp_path / "no_n", {"<unk>": 0, "A": 1, "C": 2, "G": 3, "T": 4}))
    saved = save_pretrained(tiny_model(router_bias=0.05), tmp_path / "tiny_ckpt")
    assert token_map(SHARD_VOCAB, saved).tolist() == [0, 1, 2, 3, 4]  # small vocab, no tokenizer
    with pytest.raises(GenomeLMError, match="vocabulary"):
        token_map(SHARD_VOCAB, "glm53-tiny", vocab_size=4)
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text(json.dumps({"model_type": "glm5_next_text", "vocab_size": 154880}))
    with pytest.raises(GenomeLMError, match="tokenizer.json"):
        token_map(SHARD_VOCAB, big)


def test_flat_text_config_with_pattern_fields(tmp_path):
    """Real configs may keep text fields at top level and use `index_topk_pattern`/`linear_attn_config`."""
    from genome_lm.model.weights.reader import read_text_config

    config = preset_config("glm53-tiny").to_dict()
    del config["indexer_types"]
    config.update(model_type="glm5_next", index_topk_pattern="FFFFSS", linear_attn_config={"num_heads": 2})
    (tmp_path / "config.json").write_text(json.dumps(config))
    text = read_text_config(tmp_path)
    assert text.indexer_types == ["full"] * 4 + ["shared"] * 2 and text.hidden_size == 64


def test_weight_files_follow_the_umask(tmp_path):
    """safetensors writes its files 0600; a model directory's files get the mode the umask allows, as
    every other file genome_lm writes, so a shared group can read a checkpoint."""
    import os

    old = os.umask(0o022)
    try:
        out = save_pretrained(tiny_model(), tmp_path / "ckpt")
    finally:
        os.umask(old)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        MARKER: 0o644, "config.json": 0o644, "model.safetensors": 0o644}
