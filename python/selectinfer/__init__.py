"""selectinfer: run LLMs on devices too small for them by loading and computing only the FFN
neurons that matter, on a pinned and patched llama.cpp."""
from ._native import ContextOverflowError, ModelLoadError
from ._version import __version__
from .runtime.model import Model
from .runtime.registry import MODELS, pull, quantize

__all__ = ["Model", "ModelLoadError", "ContextOverflowError", "MODELS", "pull", "quantize"]
