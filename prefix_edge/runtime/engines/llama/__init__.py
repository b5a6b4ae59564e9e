"""The llama.cpp engine (engine.py), its context (context.py) and its prefix files."""
