"""`genome-lm score` and `genome-lm variants`: per-base log-probabilities and embeddings of any region, and
variant effects by preceding context, from a fine-tuned model (docs/score.md)."""
