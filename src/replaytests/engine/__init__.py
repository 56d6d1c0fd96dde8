"""The replay engine: the seam every runtime serves (backend, boundaries, the protocol, arms, comparisons,
transplants), what every run shares (its environment, numeric flags, rollouts, conversations), and one package
per runtime (hf/, vllm/, llamacpp/)."""
