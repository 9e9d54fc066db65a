"""Drafters, one per file: `draft_model` (a small model with the target's tokenizer, with
`draft_loop` its CUDA-graph decode loop) and `ngram` (prompt lookup over `ngram_index`). The
protocols they implement are in `base`."""
