"""The layers of ``lazyx.nn``, one topic per module as in ``mlx.nn.layers``.

``_TOPICS`` is the list of topic modules; each one present is imported and it and its
``__all__`` are re-exported here (and from there by ``lazyx.nn``), so adding a layer file
means adding its name to this list and nothing else.
"""

from __future__ import annotations

import importlib
import importlib.util

_TOPICS = [
    "base", "containers", "linear", "embedding", "dropout", "normalization", "activations",
    "convolution", "convolution_transpose", "pooling", "positional_encoding", "recurrent",
    "transformer", "quantized", "upsample", "distributed",
]



def _export_topics() -> list[str]:
    names = []
    for topic in _TOPICS:
        # A topic not written yet is skipped; one that exists but fails to import raises.
        if importlib.util.find_spec(f"{__name__}.{topic}") is None:
            continue
        module = importlib.import_module(f"{__name__}.{topic}")
        names.append(topic)  # `nn.linear` names the module, as in MLX
        for name in getattr(module, "__all__", ()):
            globals()[name] = getattr(module, name)
            names.append(name)
    return names


__all__: list[str] = _export_topics()
