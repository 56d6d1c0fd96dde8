"""One llama.cpp model and context through llama-cpp-python's C API (its ctypes layer, not its `Llama`
class: the suite decides every batch, position and logits row itself).

A context holds one sequence (seq 0). Its tokens are evaluated in calls of at most `n_batch` tokens; a
call returns the logits of its last token only (the boundary's row, or the row a greedy choice reads),
except a rollout's recompute (`feed_every`): one call with every token marked as an output in the batch
(`llama_batch.logits[i]`; this C API has no context-wide `logits_all`, which is the `Llama` class's), whose
rows `llama_get_logits` returns in the batch's order (llama-context.cpp, `output_reorder`).
The sequence's whole state (its K/V cells, positions and the last logits) is saved and loaded as
llama.cpp's sequence state (`llama_state_seq_get_data` / `_set_data`). llama.cpp's own counters of the
tokens it evaluated (`llama_perf_context`: n_p_eval for calls of several tokens, n_eval for single-token
calls) prove what a cache hit did not recompute.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from replaytests.engine import stop
from replaytests.engine.llamacpp import build as llamacpp_build
from replaytests.errors import ConfigError, ReplaytestsError

INSTALL = "bash tools/install-llamacpp.sh (docs/llamacpp.md)"
BUILD_RECORD = llamacpp_build.BUILD_RECORD  # what tools/install-llamacpp.sh writes into the venv: version, ISA, flags
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}  # ggml_type of a K/V cache


class DecodeFailed(ReplaytestsError):
    """llama_decode refused a batch (no room in the context's cache, or an internal error)."""


def import_llama_cpp():
    """The llama_cpp module, silenced; a missing or broken build is one line naming the installer."""
    try:
        import llama_cpp
    except Exception as exc:  # an ImportError, or an OSError from a shared library built for another CPU
        raise ConfigError(f"--backend llamacpp: cannot import llama_cpp ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); build it with {INSTALL}") from None
    _quiet(llama_cpp)
    return llama_cpp


_LOG_CALLBACK = None  # kept alive: llama.cpp holds the pointer


def _quiet(llama_cpp) -> None:
    """llama.cpp logs every load and context to stderr; the suite reports what matters itself."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()


def version() -> str | None:
    """llama-cpp-python's version where it is installed here (read without importing it), else None."""
    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return None


def build_record() -> dict | None:
    """The build flags tools/install-llamacpp.sh recorded beside the installed wheel, or None."""
    return llamacpp_build.record()


def system_info(llama_cpp) -> str:
    """The instruction sets this build's CPU backend uses, as llama.cpp prints them."""
    return llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()


class Model:
    """A GGUF model loaded by llama.cpp (`vocab_only`: its vocabulary and metadata, no weights)."""

    def __init__(self, path: Path, vocab_only: bool = False) -> None:
        self.llama_cpp = lib = import_llama_cpp()
        params = lib.llama_model_default_params()
        params.vocab_only = vocab_only
        params.use_mmap = True
        params.n_gpu_layers = 0
        self.path = path
        self.ptr = lib.llama_model_load_from_file(os.fsencode(path), params)
        if not self.ptr:
            raise ConfigError(f"{path}: llama.cpp could not load this GGUF (truncated, or an architecture or "
                              f"tensor type this build does not know: llama-cpp-python {version()})")
        self.vocab = lib.llama_model_get_vocab(self.ptr)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        self._formatters: dict[tuple[str, bool], object] = {}  # chat templates parsed once each

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (None where the file has no such key)."""
        buf = ctypes.create_string_buffer(512)
        n = self.llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return None if n < 0 else buf.value.decode("utf-8", "replace")

    def weights(self) -> str:
        """The GGUF's weight format as llama.cpp names its file types (Q4_1, Q8_0, BF16, …)."""
        code = self.meta("general.file_type")
        names = [name.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_") for name in dir(self.llama_cpp)
                 if name.startswith("LLAMA_FTYPE_") and str(getattr(self.llama_cpp, name)) == code]
        return names[0] if names else f"file type {code}"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The token ids of `text`, special tokens parsed (a delimiter's name is its one token)."""
        raw = text.encode("utf-8")
        room = len(raw) + 8
        out = (self.llama_cpp.llama_token * room)()
        n = self.llama_cpp.llama_tokenize(self.vocab, raw, len(raw), out, room, add_special_tokens, True)
        if n < 0:
            raise ConfigError(f"{self.path}: llama.cpp could not tokenize {text!r}")
        return list(out[:n])

    def decode(self, ids: list[int]) -> str:
        """The text of `ids` (special tokens rendered), as one UTF-8 string."""
        pieces = bytearray()
        buf = ctypes.create_string_buffer(256)
        for token in ids:
            n = self.llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            pieces += buf.raw[:max(n, 0)]
        return pieces.decode("utf-8", "replace")

    def render_chat(self, template: str, messages: list[dict], generation_prompt: bool) -> str:
        """The messages through a chat template as llama-cpp-python's own chat handler renders them for a
        GGUF's `tokenizer.chat_template` (its Jinja2ChatFormatter: jinja2 in a sandbox, transformers' trim and
        lstrip settings and extensions, this vocabulary's BOS and EOS text), which its server tokenizes with
        special tokens parsed and no BOS added (`added_special`)."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        key = (template, generation_prompt)
        if key not in self._formatters:
            lib = self.llama_cpp
            eos, bos = lib.llama_vocab_eos(self.vocab), lib.llama_vocab_bos(self.vocab)
            text = {token: lib.llama_vocab_get_text(self.vocab, token).decode("utf-8") if token != -1 else ""
                    for token in (eos, bos)}
            self._formatters[key] = Jinja2ChatFormatter(template, text[eos], text[bos], generation_prompt)
        return self._formatters[key](messages=messages).prompt

    def __len__(self) -> int:
        return self.n_vocab

    def close(self) -> None:
        if self.ptr:
            self.llama_cpp.llama_model_free(self.ptr)
            self.ptr = None


class Context:
    """One llama.cpp context on a loaded model: its own K/V cache, threads, batch sizes and cache types.
    Its K/V buffer is unified across sequences (one stream), so a sequence's saved state loads into any
    context of this kind, whatever its sequence count; seq 0 is the one under test."""

    def __init__(self, model: Model, n_ctx: int, n_batch: int, threads: int, kv_type: str, flash: bool,
                 sequences: int = 1) -> None:
        lib = self.llama_cpp = model.llama_cpp
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = sequences
        params.kv_unified = True
        params.n_threads = params.n_threads_batch = threads
        params.type_k = params.type_v = KV_TYPES[kv_type]
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.no_perf = False  # the evaluated-token counters prove a cache hit
        self.model, self.n_batch, self.n_ctx = model, n_batch, n_ctx
        self.ptr = lib.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise ConfigError(f"{model.path}: llama.cpp could not create a context (n_ctx {n_ctx}, n_batch "
                              f"{n_batch}, K/V {kv_type}, flash attention {'on' if flash else 'off'})")
        self.memory = lib.llama_get_memory(self.ptr)
        self.batch = lib.llama_batch_init(n_batch, 0, 1)
        self.length = 0  # tokens of seq 0 in the cache
        self.calls = 0  # llama_decode calls so far

    def clear(self) -> None:
        """An empty cache: the next token is at position 0."""
        self.llama_cpp.llama_memory_clear(self.memory, True)
        self.length = 0

    def truncate(self, length: int) -> None:
        """Drop every cached position from `length` on (what a server keeps of a prompt it saw)."""
        if not self.llama_cpp.llama_memory_seq_rm(self.memory, 0, length, -1):
            raise DecodeFailed(f"llama.cpp could not drop positions {length}.. of the cached sequence")
        self.length = length

    def feed(self, tokens: list[int], step: str) -> np.ndarray:
        """Evaluate `tokens` of seq 0 at its next positions, in calls of at most n_batch tokens; the logits
        of the last one (float32, one per vocabulary id)."""
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            self._decode([(0, self.length, chunk)], step)
            self.length += len(chunk)
        return self.last_logits()

    def feed_every(self, tokens: list[int], step: str, rows: Sequence[int] | None = None) -> np.ndarray:
        """Evaluate `tokens` of seq 0 at its next positions in one llama_decode call with every token an
        output, or those at the offsets `rows` (ascending): their logits [n, n_vocab] float32 (a trainer's
        recompute reads them all; the edge sweep, its points'). More tokens than n_batch would be several calls:
        refused. n_ubatch = n_batch, so it is one ubatch too, and the outputs reserved per ubatch
        (n_outputs_max, 0 = n_batch) hold every row."""
        if len(tokens) > self.n_batch:
            raise DecodeFailed(f"{step}: {len(tokens)} tokens do not fit one call of {self.n_batch}")
        outputs = range(len(tokens)) if rows is None else rows
        self._decode([(0, self.length, tokens)], step, outputs=frozenset(outputs))
        self.length += len(tokens)
        logits = self.llama_cpp.llama_get_logits(self.ptr)
        return np.ctypeslib.as_array(logits, shape=(len(outputs), self.model.n_vocab)).copy()

    def feed_together(self, sequences: list[list[int]], step: str) -> np.ndarray:
        """Evaluate each sequence from position 0 as seq 0, 1, ... of one llama_decode call (a batch of
        requests); the logits of seq 0's last token."""
        if sum(map(len, sequences)) > self.n_batch:
            raise DecodeFailed(f"{step}: {sum(map(len, sequences))} tokens do not fit one call of {self.n_batch}")
        self._decode([(seq, 0, tokens) for seq, tokens in enumerate(sequences)], step)
        self.length = len(sequences[0])
        return self.last_logits()

    def _decode(self, parts: list[tuple[int, int, list[int]]], step: str,
                outputs: frozenset[int] | None = None) -> None:
        """One llama_decode call of (seq, first position, tokens) parts; logits of seq 0's last token only, or
        of seq 0's tokens at the offsets `outputs`."""
        batch, i = self.batch, 0
        for seq, first, tokens in parts:
            for offset, token in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, first + offset, 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = seq == 0 and (offset == len(tokens) - 1 if outputs is None else offset in outputs)
                i += 1
        batch.n_tokens = i
        stop.check()
        code = self.llama_cpp.llama_decode(self.ptr, batch)
        self.calls += 1
        if code != 0:
            raise DecodeFailed(f"{step}: llama_decode returned {code} at position {self.length} "
                               f"(context of {self.n_ctx} tokens)")

    def last_logits(self) -> np.ndarray:
        row = self.llama_cpp.llama_get_logits_ith(self.ptr, -1)
        return np.ctypeslib.as_array(row, shape=(self.model.n_vocab,)).copy()

    def n_ubatch(self) -> int:
        """The physical batch size llama.cpp took for this context (it clamps n_batch to n_ctx)."""
        return int(self.llama_cpp.llama_n_ubatch(self.ptr))

    def evaluated(self) -> int:
        """Tokens llama.cpp has evaluated in this context so far (its own perf counters). llama.cpp reports
        a count of 0 as 1; a counter that has run has also timed its calls, so an untimed one is 0."""
        data = self.llama_cpp.llama_perf_context(self.ptr)
        return int(data.n_p_eval) * (data.t_p_eval_ms > 0) + int(data.n_eval) * (data.t_eval_ms > 0)

    def save(self) -> bytes:
        """Seq 0's state as llama.cpp serializes it: its K/V cells and their positions."""
        lib = self.llama_cpp
        size = lib.llama_state_seq_get_size(self.ptr, 0)
        buf = (ctypes.c_uint8 * size)()
        written = lib.llama_state_seq_get_data(self.ptr, buf, size, 0)
        if written != size:
            raise DecodeFailed(f"llama.cpp wrote {written} of the {size} bytes of the sequence state")
        return bytes(buf)

    def load(self, state: bytes, length: int) -> None:
        """Replace seq 0 by a saved state of `length` tokens (from a context of any sequence count)."""
        self.clear()
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if self.llama_cpp.llama_state_seq_set_data(self.ptr, buf, len(state), 0) != len(state):
            raise DecodeFailed("llama.cpp refused a saved sequence state")
        self.length = length

    def close(self) -> None:
        if self.ptr:
            self.llama_cpp.llama_batch_free(self.batch)
            self.llama_cpp.llama_free(self.ptr)
            self.ptr = None


def quantize(source: Path, out: Path, kind: str, threads: int) -> None:
    """`source` (a GGUF) quantized to `kind` (q8_0, q4_1, …) by llama.cpp's own quantizer, written to `out`."""
    lib = import_llama_cpp()
    ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{kind.upper()}", None)
    if ftype is None:
        raise ConfigError(f"--type {kind}: llama-cpp-python {version()} has no such quantization type")
    params = lib.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    if lib.llama_model_quantize(os.fsencode(source), os.fsencode(out), ctypes.byref(params)) != 0:
        raise ConfigError(f"{source}: llama.cpp could not quantize it to {kind}")
