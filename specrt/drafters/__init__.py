"""Kept so `specrt.drafters.ngram_index` imports as before; drafters live in
`specrt.spec.drafters`."""
