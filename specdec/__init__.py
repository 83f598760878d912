"""specdec: exact speculative decoding of GGUF models on the CPU."""


def _checkout_kernels() -> None:
    """Make ``specdec.kernels`` the kernels/ folder next to this one in a source checkout.

    The Numba kernels live in the top-level folder kernels/ and are installed as the
    subpackage ``specdec.kernels`` (pyproject.toml: ``package-dir``), so an install has
    specdec/kernels/ and this does nothing.  A source checkout (specdec/ and kernels/ side by
    side, pyproject.toml above them) run without that mapping -- from its root with no install,
    or with an editable install of another checkout -- would find no specdec.kernels, or
    another checkout's: there the sibling folder is loaded under that name, so a checkout
    always runs its own kernels.
    """
    import importlib.util
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    init = here.parent / "kernels" / "__init__.py"
    if (here / "kernels").exists() or not (init.is_file() and (here.parent / "pyproject.toml").is_file()):
        return                                      # installed, or not a checkout
    found = importlib.util.find_spec(__name__ + ".kernels")
    if found is not None and found.origin and Path(found.origin).resolve() == init:
        return                                      # an editable install of this checkout
    spec = importlib.util.spec_from_file_location(__name__ + ".kernels", init,
                                                  submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    globals()["kernels"] = module


_checkout_kernels()

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
