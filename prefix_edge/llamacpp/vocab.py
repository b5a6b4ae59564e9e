"""llama.cpp's own tokenizer of a GGUF file: the model's vocabulary loaded alone (`vocab_only`,
no weights: a 262k-piece vocabulary loads in well under a second), so export can hold a bundle's
tokenizer.json to what the deployed model was trained to read."""

from __future__ import annotations

import ctypes
from pathlib import Path

from ..errors import PrefixEdgeError
from .lib import load_llama_cpp


class Vocab:
    """A GGUF's vocabulary, tokenizing as llama.cpp does. Use as a context manager."""

    def __init__(self, path: Path):
        L = load_llama_cpp()
        self._L = L
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        self._model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self._model:
            raise PrefixEdgeError(f"{path}: llama.cpp cannot load its vocabulary")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self._vocab))
        self.kind = int(L.llama_vocab_type(self._vocab))
        bos = int(L.llama_vocab_bos(self._vocab))
        self.bos = bos if bos >= 0 else None
        self.add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """llama_tokenize of `text`: `add_special` puts the BOS (and EOS) the GGUF asks for,
        `parse_special` reads the spelling of a control token as that token."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        for _ in range(2):
            buf = (self._L.llama_token * cap)()
            n = self._L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            cap = -n
        raise PrefixEdgeError(f"llama.cpp could not tokenize a text of {len(data)} bytes")

    def attrs(self) -> list[int]:
        """Every token's LLAMA_TOKEN_ATTR_* bits, as llama.cpp reads them: the GGUF's token types
        after llama.cpp's own corrections (an end-of-turn-looking NORMAL token becomes CONTROL)."""
        get = self._L.llama_vocab_get_attr
        return [int(get(self._vocab, i)) for i in range(self.n_vocab)]

    def eog(self) -> list[int]:
        """The tokens that end a generation for llama.cpp (EOS, EOT, <|im_end|>, ...)."""
        is_eog = self._L.llama_vocab_is_eog
        return [i for i in range(self.n_vocab) if is_eog(self._vocab, i)]

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self._L.llama_token_to_piece(self._vocab, token, buf, 256, 0, True)
        return buf.raw[:max(n, 0)]

    def close(self) -> None:
        if self._model:
            self._L.llama_model_free(self._model)
            self._model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
# LLAMA_TOKEN_ATTR_* bits
ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_LSTRIP, ATTR_RSTRIP = 1, 8, 16, 128, 256
