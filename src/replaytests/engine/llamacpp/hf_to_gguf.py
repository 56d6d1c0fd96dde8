"""llama.cpp's own converter (convert_hf_to_gguf.py, as the llama-cpp-python sdist vendors it), run on one
Hugging Face directory in a process of its own:

    python -m replaytests.engine.llamacpp.hf_to_gguf CONVERTER_DIR [convert_hf_to_gguf.py arguments]

Two additions, for a byte-level tokenizer the converter's tables do not know (the embedded tiny model's own
256-byte vocabulary, which has no merges):
- The converter names a BPE tokenizer's pre-tokenizer from a table of known tokenizers (a hash of how it
  splits a test string) and refuses any other. One whose pre-tokenizer is exactly GPT-2's (byte-level,
  GPT-2's split regex, no normalizer) is written as llama.cpp's "gpt-2", the same pre-tokenization.
  Anything else is still refused.
- A BPE vocabulary with no merges gets an empty merges list: llama.cpp refuses a BPE vocabulary without
  the key, and its tokenizer then merges nothing, as the Hugging Face one does.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from replaytests.errors import ConfigError
from replaytests.files import lookup, read_json

SCRIPT = "convert_hf_to_gguf.py"


def splits_as_gpt2(model_dir: Path) -> bool:
    """The tokenizer.json pre-tokenizes exactly as GPT-2 does: one ByteLevel step with its regex, no normalizer."""
    try:
        spec = read_json(model_dir / "tokenizer.json", "tokenizer", ConfigError)
    except ConfigError:
        return False
    pre = lookup(spec, "pre_tokenizer") or {}
    return (isinstance(spec, dict) and spec.get("normalizer") is None and lookup(pre, "type") == "ByteLevel"
            and lookup(pre, "use_regex", default=True) and not lookup(pre, "add_prefix_space", default=False))


def main() -> None:
    converter, *args = sys.argv[1:]
    sys.path.insert(0, converter)
    from conversion import base  # the converter's own package, from CONVERTER_DIR

    known = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            if splits_as_gpt2(Path(self.dir_model)):
                return "gpt-2"
            raise

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    set_vocab_gpt2 = base.TextModel._set_vocab_gpt2

    gguf = base.gguf
    array, string = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING

    def _set_vocab_gpt2(self) -> None:
        set_vocab_gpt2(self)
        if not any(gguf.Keys.Tokenizer.MERGES in shard for shard in self.gguf_writer.kv_data):
            self.gguf_writer.add_key_value(gguf.Keys.Tokenizer.MERGES, [], array, sub_type=string)

    base.TextModel._set_vocab_gpt2 = _set_vocab_gpt2
    pack_val = gguf.GGUFWriter._pack_val

    def _pack_val(self, val, vtype, add_vtype: bool, sub_type=None) -> bytes:
        if vtype == array and sub_type is not None and len(val) == 0:  # the writer refuses any empty array
            return (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type) + self._pack("Q", 0)
        return pack_val(self, val, vtype, add_vtype, sub_type)

    gguf.GGUFWriter._pack_val = _pack_val
    sys.argv = [SCRIPT, *args]
    runpy.run_path(str(Path(converter) / SCRIPT), run_name="__main__")


if __name__ == "__main__":
    main()
