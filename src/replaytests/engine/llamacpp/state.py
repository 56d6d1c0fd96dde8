"""llama.cpp's serialized sequence state, read as K/V tensors and spliced layer by layer.

`llama_state_seq_get_data` writes one sequence of a plain K/V cache as (little-endian; llama.cpp's
llama-context.cpp state_seq_write and llama-kv-cache.cpp state_write):

    u32 magic, i32 seq_id, u32 n_stream
    per stream: u32 cell_count; per cell: i32 pos, u32 n_seq_id, i32 seq_id x n_seq_id
                u32 v_trans, u32 n_layer
                per layer: i32 k_type, u64 k_row_bytes, cell_count rows            (one row per cell)
                per layer: i32 v_type, u64 v_row_bytes, cell_count rows            (v_trans 0: flash attention)
                       or: i32 v_type, u32 elem_bytes, u32 n_embd_v, n_embd_v x cell_count elements (transposed)

The layout is llama.cpp's, not a documented format: a state that does not parse exactly (a layout this
build writes differently, an extended cell) is refused in one line, never half read. K and V are
exposed as tensors over the state's own bytes (a cache whose `layers[i].keys` / `.values` are [1, 1,
cells, n_embd]); a transplant copies the selected layers' byte ranges from a donor's state into a copy
of the recipient's, which llama.cpp then loads as it loads any saved state.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from replaytests.errors import TransplantRefused

MAGIC = 0xAF143CD8
DTYPES = {0: torch.float32, 1: torch.float16}  # ggml_type -> torch: rows read as they are stored
Q8_0, Q8_0_BLOCK, Q8_0_BYTES = 8, 32, 34  # ggml's q8_0: blocks of 32 int8 with one f16 scale in front


@dataclass(frozen=True)
class Part:
    """Where one layer's K or V lies in a state: its bytes and their shape as [cells, n_embd]."""

    offset: int
    size: int
    ggml_type: int
    cells: int
    n_embd: int
    transposed: bool  # stored [n_embd, cells] (V without flash attention)


class StateLayout(ValueError):
    """A sequence state this parser does not read exactly."""


def parse(state: bytes) -> list[tuple[Part, Part]]:
    """Every layer's (K, V) part of a one-stream sequence state."""
    offset = 0

    def read(fmt: str) -> tuple:
        nonlocal offset
        values = struct.unpack_from(fmt, state, offset)
        offset += struct.calcsize(fmt)
        return values

    try:
        magic, _seq, streams = read("<IiI")
        if magic != MAGIC or streams != 1:
            raise StateLayout(f"magic {magic:#x}, {streams} streams (expected {MAGIC:#x}, 1: a unified K/V buffer)")
        (cells,) = read("<I")
        for _ in range(cells):
            _pos, n_seq = read("<iI")
            read(f"<{n_seq}i")
        v_trans, n_layer = read("<II")
        keys = []
        for _ in range(n_layer):
            ggml_type, row = read("<iQ")
            keys.append(Part(offset, cells * row, ggml_type, cells, _elements(ggml_type, row), False))
            offset += cells * row
        values = []
        for _ in range(n_layer):
            if v_trans:
                ggml_type, elem, n_embd = read("<iII")
                values.append(Part(offset, n_embd * cells * elem, ggml_type, cells, n_embd, True))
                offset += n_embd * cells * elem
            else:
                ggml_type, row = read("<iQ")
                values.append(Part(offset, cells * row, ggml_type, cells, _elements(ggml_type, row), False))
                offset += cells * row
    except struct.error as exc:
        raise StateLayout(f"the state ends early ({exc})") from None
    if offset != len(state):
        raise StateLayout(f"{len(state) - offset} bytes past the last layer")
    return list(zip(keys, values, strict=True))


def _elements(ggml_type: int, row: int) -> int:
    if ggml_type == Q8_0:
        return row // Q8_0_BYTES * Q8_0_BLOCK
    dtype = DTYPES.get(ggml_type)
    return row // dtype.itemsize if dtype is not None else 0


def tensor(buffer: bytearray, part: Part) -> torch.Tensor:
    """The part as a [1, 1, cells, n_embd] tensor: over `buffer` (no copy) for f32 and f16 rows; for q8_0
    rows, what attention reads of them (each block's int8 times its f16 scale, in float32, a copy)."""
    if part.ggml_type == Q8_0 and not part.transposed:
        raw = torch.frombuffer(buffer, dtype=torch.uint8, count=part.size, offset=part.offset)
        blocks = raw.view(part.cells, part.n_embd // Q8_0_BLOCK, Q8_0_BYTES)
        scale = blocks[..., :2].contiguous().view(torch.float16).float()
        values = blocks[..., 2:].contiguous().view(torch.int8).float() * scale
        return values.reshape(part.cells, part.n_embd).unsqueeze(0).unsqueeze(0)
    dtype = DTYPES.get(part.ggml_type)
    if dtype is None:
        raise StateLayout(f"a K/V cache of ggml type {part.ggml_type} has no tensor view here")
    flat = torch.frombuffer(buffer, dtype=dtype, count=part.size // dtype.itemsize, offset=part.offset)
    if part.transposed:
        return flat.view(part.n_embd, part.cells).t().unsqueeze(0).unsqueeze(0)
    return flat.view(part.cells, part.n_embd).unsqueeze(0).unsqueeze(0)


class _Layer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class StateCache:
    """A saved sequence state with transformers' Cache interface (engine.boundary.cache_layers)."""

    def __init__(self, state: bytes) -> None:
        self.buffer = bytearray(state)  # its own storage: two boundaries never share K/V bytes
        self.parts = parse(state)
        self.layers = [_Layer(tensor(self.buffer, k), tensor(self.buffer, v)) for k, v in self.parts]

    def get_seq_length(self) -> int:
        return self.parts[0][0].cells if self.parts else 0


def splice(recipient: bytes, donor: bytes, layers: list[int], parts: tuple[str, ...], where: str) -> bytes:
    """The recipient's state with the selected layers' K and/or V bytes copied from the donor's."""
    mine, theirs = parse(recipient), parse(donor)
    out = bytearray(recipient)
    for index in layers:
        for part in parts:
            a, b = (pair[index][0 if part == "k" else 1] for pair in (mine, theirs))
            if (a.offset, a.size, a.ggml_type) != (b.offset, b.size, b.ggml_type):
                raise TransplantRefused(f"{where}: layer {index} {part.upper()} lies elsewhere in the donor's state "
                                        f"({b.offset}+{b.size}, type {b.ggml_type}) than in the recipient's "
                                        f"({a.offset}+{a.size}, type {a.ggml_type})")
            out[a.offset:a.offset + a.size] = donor[b.offset:b.offset + b.size]
    return bytes(out)
