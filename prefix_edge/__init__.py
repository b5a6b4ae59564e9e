"""prefix-edge: run task-specialised language models on the edge with precomputed KV prefixes.

The runtime (``Runtime``) needs only numpy, onnxruntime and tokenizers: no torch.
"""

from .errors import PrefixEdgeError
from .runtime.generate import Result, Runtime, Stats

__all__ = ["PrefixEdgeError", "Result", "Runtime", "Stats"]
__version__ = "0.1.0"
