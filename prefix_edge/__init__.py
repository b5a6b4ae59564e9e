"""prefix-edge: run task-specialised language models on the edge with precomputed KV prefixes.

The runtime (``Runtime``) needs only numpy, onnxruntime and tokenizers: no torch.
"""

from .errors import PrefixEdgeError, RuntimeBusy, RuntimeClosed
from .runtime.runtime import Runtime
from .runtime.stream import AsyncStream, Result, Stats, Stream

__all__ = ["AsyncStream", "PrefixEdgeError", "Result", "Runtime", "RuntimeBusy", "RuntimeClosed", "Stats", "Stream"]
__version__ = "0.1.0"
