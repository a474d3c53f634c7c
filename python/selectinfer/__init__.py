"""selectinfer: run LLMs on devices too small for them by loading and computing only the FFN
neurons that matter, on a pinned and patched llama.cpp."""
from ._native import ContextOverflowError, ModelLoadError
from .model import Model
from .registry import MODELS, pull, quantize

__all__ = ["Model", "ModelLoadError", "ContextOverflowError", "MODELS", "pull", "quantize"]
__version__ = "0.1.0"
