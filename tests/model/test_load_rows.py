"""Reading weights a slice at a time: `to_disk_layout` of any rows points into the on-disk tensors,
`CheckpointReader` reads them from safetensors, `load_weights_` fills a model in place (no second
model), and a checkpoint that does not fit is a GenomeLMError naming the key."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import genome_lm.model as model_pkg
from genome_lm.errors import GenomeLMError
from genome_lm.model import build, save_pretrained
from genome_lm.model.weights.layout import to_disk_layout
from genome_lm.model.weights.reader import CheckpointReader, LoadReport, load_weights_
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_to_disk_layout_of_any_rows_points_into_the_whole_layout():
    model = tiny_model(router_bias=0.05)
    for name, tensor in model.state_dict().items():
        whole = {key: part for key, row, part in to_disk_layout(name, tensor)}
        n = tensor.shape[0]
        for start, stop in ((0, n), (0, 1), (n // 3, n - n // 3), (max(0, n // 3 - 1), n // 3 + 2), (n - 1, n)):
            if n >= stop > start:
                got = list(to_disk_layout(name, tensor[start:stop], start, n))
                assert torch.cat([view.reshape(-1) for _, _, view in got]).equal(tensor[start:stop].reshape(-1)), name
                for key, row, view in got:
                    assert torch.equal(view, whole[key][row:row + len(view)]), (name, key)
    # rows of the middle third of a conv weight come from the k piece only; experts 2..5 only from theirs
    conv = model.model.layers[0].self_attn.conv1d.weight
    assert [(k, r) for k, r, _ in to_disk_layout("model.layers.0.self_attn.conv1d.weight", conv[70:128], 70, 192)] == [
        ("model.layers.0.self_attn.k_conv1d.weight", 6)]
    down = model.model.layers[1].mlp.experts.down_proj
    assert [k for k, _, _ in to_disk_layout("model.layers.1.mlp.experts.down_proj", down[2:6], 2)] == [
        f"model.layers.1.mlp.experts.{e}.down_proj.weight" for e in range(2, 6)]


def test_load_weights_in_place_without_a_second_model(tmp_path, monkeypatch):
    source = tiny_model(1, router_bias=0.05)
    ckpt = save_pretrained(source, tmp_path / "ckpt", max_shard_bytes=60_000)
    target = tiny_model(2, router_bias=0.05)
    params = {n: p for n, p in target.named_parameters()}

    def no_build(*args, **kwargs):
        raise AssertionError("load_weights_ built a model")

    monkeypatch.setattr(model_pkg, "build", no_build)
    assert load_weights_(target, ckpt, dtype=None) == LoadReport()
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
    assert all(p is params[n] for n, p in target.named_parameters())  # filled in place


def test_load_weights_casts_like_build(tmp_path):
    ckpt = save_pretrained(tiny_model(1, router_bias=0.05), tmp_path / "ckpt")
    built = build("glm53-tiny", dtype="bfloat16")
    target = built.model
    load_weights_(target, ckpt, dtype=built.dtype)
    want = build(ckpt, dtype="bfloat16").model.state_dict()
    got = target.state_dict()
    assert all(got[k].dtype == v.dtype and torch.equal(got[k], v) for k, v in want.items())


def test_checkpoint_that_does_not_fit_names_the_key(tmp_path):
    ckpt = save_pretrained(tiny_model(1, router_bias=0.05), tmp_path / "ckpt")
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}

    def variant(name, change):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text((ckpt / "config.json").read_text())
        save_file(change(dict(tensors)), str(d / "model.safetensors"))
        return d

    key = "model.layers.2.mlp.experts.3.up_proj.weight"
    missing = variant("missing", lambda t: {k: v for k, v in t.items() if k != key})
    with pytest.raises(GenomeLMError, match=rf"lacks 1 weight\(s\) of the text model, e.g. \['{key}'\]"):
        load_weights_(tiny_model(router_bias=0.05), missing, dtype=None)
    wrong = variant("wrong", lambda t: {**t, "model.norm.weight": torch.zeros(65)})
    with pytest.raises(GenomeLMError, match=r"model.safetensors: model.norm.weight has shape \(65,\).*\(64,\)"):
        load_weights_(tiny_model(router_bias=0.05), wrong, dtype=None)
    twice = variant("twice", lambda t: t)
    save_file({"model.norm.weight": tensors["model.norm.weight"]}, str(twice / "model-copy.safetensors"))
    with pytest.raises(GenomeLMError, match=r"holds model.norm.weight \(and 0 more\) in more than one"):
        load_weights_(tiny_model(router_bias=0.05), twice, dtype=None)
    reader = CheckpointReader(ckpt, tiny_model(router_bias=0.05).config)
    rows = torch.zeros(2, 64, 64)
    reader.read_("model.layers.1.mlp.experts.gate_up_proj", rows, 3, 8, None)
    assert torch.equal(rows, tiny_model(1, router_bias=0.05).model.layers[1].mlp.experts.gate_up_proj[3:5])
    # unused: what none of the given tensors needs
    _, unused = reader.check({"model.layers.1.mlp.experts.gate_up_proj": (8, 64, 64), "model.norm.weight": (64,)})
    assert "model.layers.1.mlp.experts.7.up_proj.weight" not in unused and "model.norm.weight" not in unused
    assert {"lm_head.weight", "model.layers.1.mlp.experts.7.down_proj.weight"} <= set(unused)
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "config.json").write_text(json.dumps({"model_type": "glm5_next_text"}))
    with pytest.raises(GenomeLMError, match="no \\*.safetensors"):
        load_weights_(tiny_model(router_bias=0.05), tmp_path / "nothing", dtype=None)


def test_only_weights_the_model_has_no_place_for_are_logged(tmp_path, caplog):
    ckpt = save_pretrained(tiny_model(1, router_bias=0.05), tmp_path / "ckpt", max_shard_bytes=60_000)
    with caplog.at_level("WARNING"):
        assert load_weights_(tiny_model(router_bias=0.05), ckpt, dtype=None) == LoadReport()
    assert "not used" not in caplog.text
    save_file({"model.layers.0.mlp.extra.weight": torch.zeros(2)}, str(ckpt / "model-extra.safetensors"))
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.mlp.extra.weight"] = "model-extra.safetensors"
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with caplog.at_level("WARNING"):
        report = load_weights_(tiny_model(router_bias=0.05), ckpt, dtype=None)
    assert report == LoadReport(unexpected=("model.layers.0.mlp.extra.weight",))
    assert "1 weights not used by the model, e.g. ['model.layers.0.mlp.extra.weight']" in caplog.text
