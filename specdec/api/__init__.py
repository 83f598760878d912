"""The public API: `load` and `Model` (model.py), the one request path under
`Model.generate`, `Conversation` and `specdec serve` (request.py: `DraftOptions`, `Runner`,
`Completion`), and `Conversation` (conversation.py)."""
from .conversation import Conversation
from .model import Model, load
from .request import Completion, DraftOptions

__all__ = ["load", "Model", "Completion", "DraftOptions", "Conversation"]
