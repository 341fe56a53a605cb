"""The model's weights on disk (safetensors): `layout` (key layout, dtypes), `reader`, `writer`."""
