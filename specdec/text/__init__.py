"""Text: the model's tokenizer (SentencePiece and BPE vocabularies from the GGUF file) and its
chat template (sandboxed Jinja2)."""
