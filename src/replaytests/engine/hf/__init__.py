"""The Hugging Face transformers backend: one forward call with an explicit 4D mask, in one process.

Everything in the suite that imports transformers lives here (`adapter`), apart from model preparation
(`inputs/preparation.py`), which writes checkpoints and runs no test.
"""
