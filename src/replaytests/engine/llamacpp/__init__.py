"""llama.cpp through llama-cpp-python (docs/llamacpp.md)."""
