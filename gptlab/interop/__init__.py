"""Interoperability with Hugging Face: gptlab's GPT as transformers' GPT-2 and back (hf.py: config and weights),
and a run's tokenizer as Hugging Face tokenizer files (tokenizer.py). transformers is imported only inside these
functions (the `gptlab[hf]` extra), so training never imports it."""
