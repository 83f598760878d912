"""The one error family that reaches users: one line, naming the file or flag and the problem."""


class SpecdecError(Exception):
    """Base of every error specdec reports to a user (CLI exit code 2)."""


class GGUFError(SpecdecError):
    """The file is missing, not GGUF, truncated or inconsistent."""


class UnsupportedModelError(SpecdecError):
    """Architecture or tensor type that specdec does not run."""


class TokenizerError(SpecdecError):
    """The vocabulary in the file cannot be turned into a tokenizer."""


class ContextOverflowError(SpecdecError):
    """More tokens than the context window holds."""


class IncompatibleDraftError(SpecdecError):
    """Target and draft do not share a vocabulary."""


class ConfigError(SpecdecError):
    """A flag or parameter is out of range."""


class ChatTemplateError(SpecdecError):
    """The model's chat template cannot be rendered for these messages."""


class NumericalError(SpecdecError):
    """The model computed non-finite logits: its weights are corrupt or out of range."""


class ResourceError(SpecdecError):
    """What was asked for (a context, a file read into memory) does not fit in this machine."""


class CacheFileError(SpecdecError):
    """The lookup cache file (--lookup-cache) cannot be read or written, or is for another model."""


class ConstraintError(SpecdecError):
    """A JSON schema, grammar or regular expression that cannot constrain generation (invalid,
    or over the stated size limit).  `field` names what was wrong: 'json_schema', 'grammar',
    'regex', 'response_format', ... (the request field or CLI flag a front-end reports)."""

    def __init__(self, message: str, field: str = "grammar"):
        super().__init__(message)
        self.field = field
