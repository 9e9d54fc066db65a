"""The edge: the text API (`LLM`), the command lines, tokenizer and chat template, and
streaming detokenization. The only layer that prints (its CLIs) or sees text."""
