"""specdec: exact speculative decoding of GGUF models on the CPU."""


def _kernels_here() -> None:
    """Fail in one line, saying ``pip install -e .``, where ``specdec.kernels`` is missing or is
    another checkout's: the top-level kernels/ folder becomes ``specdec.kernels`` by an install
    (pyproject.toml's ``package-dir``), which a source checkout run without one lacks."""
    import importlib
    from pathlib import Path

    here = Path(__file__).resolve().parent
    mine = here.parent / "kernels"
    try:
        kernels = importlib.import_module(__name__ + ".kernels")
    except ModuleNotFoundError as e:
        if e.name != __name__ + ".kernels":
            raise
        raise ImportError(f"specdec.kernels is not installed: run `pip install -e .` in {here.parent}") from None
    if (mine / "__init__.py").is_file() and (here.parent / "pyproject.toml").is_file() \
            and Path(kernels.__file__).resolve().parent != mine:
        raise ImportError(f"specdec.kernels is {Path(kernels.__file__).parent}, not this checkout's {mine}: "
                          f"run `pip install -e .` in {here.parent}")


_kernels_here()

# The layers, bottom up: kernels/ (specdec.kernels) -> engine/ (reader, config, model, KV
# cache), text/ (tokenizer, template), models/ (the hub) -> generation/ (interfaces,
# sampling, plain decoding) -> speculation/ -> api/ (load, Model, the request path,
# Conversation) -> frontends/ (cli, chat, serve, bench, report).  Users' names are
# re-exported here.
from .api import Completion, Conversation, DraftOptions, Model, load  # noqa: E402
from .errors import (ConfigError, ConstraintError, ContextOverflowError, GGUFError,  # noqa: E402
                     IncompatibleDraftError, SpecdecError, TokenizerError, UnsupportedModelError)
from .generation.constraint import ConstraintSpec  # noqa: E402
from .speculation.drafters import (Draft, Drafter, ForcedDrafter, HybridDrafter, ModelDrafter,  # noqa: E402
                                   PredictionDrafter, PromptLookupDrafter, SuffixDrafter, SuffixStore)
from .speculation.policies import AdaptiveLength, DraftPolicy, FixedLength, Threshold  # noqa: E402

__all__ = ["load", "Model", "Completion", "Conversation", "DraftOptions", "Draft", "Drafter",
           "ModelDrafter", "PredictionDrafter", "PromptLookupDrafter", "HybridDrafter", "SuffixDrafter", "SuffixStore",
           "DraftPolicy", "FixedLength",
           "Threshold", "AdaptiveLength", "SpecdecError", "GGUFError", "UnsupportedModelError",
           "TokenizerError", "ContextOverflowError", "IncompatibleDraftError", "ConfigError",
           "ConstraintSpec", "ConstraintError", "ForcedDrafter"]
__version__ = "0.1.0"
