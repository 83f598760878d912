"""The tests' tiny synthetic GGUF models: specdec.testing.synth, the public writer."""
from specdec.testing.synth import (TinySpec, _random_kquant, _tokens, tokenizer_metadata,  # noqa: F401
                                   write_tiny_model)
