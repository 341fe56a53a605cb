"""The model's weights on disk (Hugging Face safetensors), one module per job: `layout.py` the
key layout (on disk <-> upstream modules) and dtype policy, `reader.py` checkpoint directories and
`load_weights_`, `writer.py` `save_pretrained` / `write_model_dir`."""
