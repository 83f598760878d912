"""specdec: exact speculative decoding of GGUF models on the CPU."""
from .api import Completion, Model, load
from .chat import Conversation
from .errors import (ConfigError, ContextOverflowError, GGUFError, IncompatibleDraftError,
                     SpecdecError, TokenizerError, UnsupportedModelError)

__all__ = ["load", "Model", "Completion", "Conversation", "SpecdecError", "GGUFError", "UnsupportedModelError",
           "TokenizerError", "ContextOverflowError", "IncompatibleDraftError", "ConfigError"]
__version__ = "0.1.0"
