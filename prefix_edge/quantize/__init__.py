"""Model quantization, one function per target."""
