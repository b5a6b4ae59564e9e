"""llama.cpp as a library (llama-cpp-python's bindings): loading it, probing it, running the calls
that may abort in a child process, quantizing, and reading and writing its sequence-state blobs.
The runtime's GGUF engine (runtime/engines/llama/) and export's GGUF steps build on it."""
