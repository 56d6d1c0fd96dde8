"""The replay engine: the protocol, the Hugging Face adapter, the runtime, boundaries, decoding,
constructions, comparisons and cache transplant."""
