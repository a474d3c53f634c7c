"""Registers the `selectinfer` model with lm-evaluation-harness on import (evaluation/lm_eval_adapter.py)."""
from .evaluation.lm_eval_adapter import SelectInferLM, main  # noqa: F401
