"""The SelectInfer GGUF's keys, version and defaults, from the engine's one table
(cpp/llama/si_format.h, exported as _native.FORMAT); docs/format.md describes each key."""
from __future__ import annotations

from typing import Any

from .. import _native

FORMAT_VERSION: int = _native.FORMAT["version"]
DEFAULT_COMPUTE_RATIO: float = _native.FORMAT["compute_ratio"]  # phi a file suggests (within [delta, gamma])
DEFAULT_TOKEN_RATIO: float = _native.FORMAT["token_ratio"]  # alpha
ARCHITECTURES: tuple[str, ...] = tuple(_native.FORMAT["architectures"])
KEY_IDS: tuple[str, ...] = tuple(_native.FORMAT["keys"])


def key(key_id: str, layer: int | None = None) -> str:
    """The GGUF key of a format key by its id ("load_ratio", "neuron_ids", ...); a per-layer key
    takes its layer."""
    entry = _native.FORMAT["keys"][key_id]
    if entry["per_layer"] != (layer is not None):
        raise ValueError(f"{key_id} is {'a' if entry['per_layer'] else 'not a'} per-layer key")
    return entry["name"] + ("" if layer is None else str(int(layer)))


def entry(key_id: str, value: Any, layer: int | None = None) -> tuple[str, str, Any]:
    """(GGUF key, type, value) of a key to write (_native.write_gguf_header), typed by the table."""
    return key(key_id, layer), _native.FORMAT["keys"][key_id]["type"], value


def read(kv: dict, key_id: str, layer: int | None = None, default: Any = None) -> Any:
    """A key's value in a GGUF header's metadata (kv: name -> value), or default."""
    return kv.get(key(key_id, layer), default)
