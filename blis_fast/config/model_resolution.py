"""Where a run's model and hardware descriptions come from (ENG-10.4, DELTA-22/25).

The model's HuggingFace ``config.json``: ``--model-config-folder``, else
``<defaults dir>/model_configs/<name after '/'>``, else a HuggingFace download, which this
offline port replaces by the bundled copies (anything else fails as a failed download does).
The hardware file: ``--hardware-config``, else ``hardware_config.json`` beside the defaults
file. The maximum model length: ``max_position_embeddings`` scaled by ``rope_scaling`` where the
reference (and vLLM) scale it.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from blis_fast.config.defaults import get_hf_repo, load_defaults
from blis_fast.config.model_config import HFConfig, is_hf_config
from blis_fast.data import data_dir
from blis_fast.errors import BlisConfigError, BlisError, BlisInputError
from blis_fast.files import read_input_bytes

__all__ = [
    "apply_rope_scaling",
    "bundled_model_config_dir",
    "max_model_len_from_config",
    "resolve_hardware_config",
    "resolve_model_config",
]

_HF_BASE_URL = "https://huggingface.co"
_HF_REPO_PATTERN = re.compile(r"[a-zA-Z0-9._-]+/[a-zA-Z0-9._-]+\Z")
_MAX_INT_F = 9.223372036854775808e18  # float64(math.MaxInt) on 64-bit


def bundled_model_config_dir(model: str, base_dir: str) -> str:
    """``<base_dir>/model_configs/<name after the first '/'>`` (path traversal rejected)."""
    parts = model.split("/", 1)
    short = parts[1] if len(parts) == 2 else model
    short = os.path.normpath(short) if short else "."
    if ".." in short or os.path.isabs(short):
        raise BlisConfigError(f"--model: model name {model!r} contains invalid path components")
    return os.path.join(base_dir, "model_configs", short)


def _offline_fetch(hf_repo: str, model: str, local_dir: str, infos: list[str]) -> str:
    """Stand-in for the reference's HuggingFace download (this port never uses the network).

    The bundled ``model_configs/`` copies (HF configs themselves) play the role of the remote:
    a model found there resolves; anything else fails as a failed download does.
    """
    if not _HF_REPO_PATTERN.match(hf_repo):
        raise BlisConfigError(
            f"invalid HuggingFace repo name {hf_repo!r}: expected org/model made of letters, digits, '.', '-', '_'"
        )
    bundled = bundled_model_config_dir(model, str(data_dir()))
    candidate = os.path.join(bundled, "config.json")
    if os.path.abspath(bundled) != os.path.abspath(local_dir):
        try:
            data = read_input_bytes(candidate)
        except OSError:
            data = None
        if data is not None and is_hf_config(data):
            infos.append(
                f"--latency-model: using the bundled config of {model} from {bundled} (no download)"
            )
            return bundled
    url = f"{_HF_BASE_URL}/{hf_repo}/resolve/main/config.json"
    raise BlisConfigError(f"no network access: {url} is not downloaded by blis_fast")


def resolve_model_config(
    model: str, explicit_folder: str, defaults_path: str, warnings: list[str], infos: list[str]
) -> str:
    """The folder holding the model's config.json: explicit flag, bundled copy, else error."""
    if explicit_folder:
        return explicit_folder
    base_dir = os.path.dirname(defaults_path)
    local_dir = bundled_model_config_dir(model, base_dir)
    local_path = os.path.join(local_dir, "config.json")
    try:
        data = read_input_bytes(local_path)
    except OSError:
        data = None
    if data is not None:
        if is_hf_config(data):
            infos.append(f"--latency-model: using config from {local_dir}")
            return local_dir
        warnings.append(
            f"--latency-model: {local_path} is not a HuggingFace config (no num_hidden_layers or hidden_size, "
            "at the top level or in text_config); trying HuggingFace"
        )
    defaults_err: BlisError | None = None
    hf_repo = ""
    try:
        hf_repo = get_hf_repo(load_defaults(defaults_path), model)
    except BlisInputError as exc:
        defaults_err = exc
        warnings.append(
            f"--latency-model: hf_repo of {model} unavailable ({exc}); the download may fail on case"
        )
    if not hf_repo:
        hf_repo = model
    try:
        return _offline_fetch(hf_repo, model, local_dir, infos)
    except BlisConfigError as exc:
        warnings.append(f"--latency-model: HuggingFace download for {model} failed: {exc}")
    msg = (
        f"--model-config-folder: no config.json found for model {model!r} "
        f"(looked in {local_dir} and at {_HF_BASE_URL}/{hf_repo}); give --model-config-folder explicitly"
    )
    if defaults_err is not None:
        msg += f" (reading the defaults file failed: {defaults_err})"
    raise BlisConfigError(msg)


def resolve_hardware_config(explicit_path: str, defaults_path: str) -> str:
    """The hardware file: explicit flag, else ``hardware_config.json`` beside the defaults file."""
    if explicit_path:
        return explicit_path
    bundled = os.path.join(os.path.dirname(defaults_path), "hardware_config.json")
    if os.path.exists(bundled):
        return bundled
    raise BlisConfigError(
        f"--hardware-config: no hardware config at {bundled!r}; give --hardware-config explicitly"
    )



def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rope_type(rope: dict[str, Any]) -> str:
    t = rope.get("type")
    rtype = t if isinstance(t, str) else ""
    if rtype == "":
        t = rope.get("rope_type")
        rtype = t if isinstance(t, str) else ""
    return rtype


def apply_rope_scaling(max_pos: int, model_type: str, rope: Any) -> tuple[int, bool]:
    """Scale ``max_position_embeddings`` by ``rope_scaling.factor`` where the reference (and vLLM) do."""
    if max_pos <= 0 or "gemma3" in model_type or rope is None or not isinstance(rope, dict):
        return max_pos, False
    rtype = _rope_type(rope)
    if rtype in ("su", "longrope", "llama3"):
        return max_pos, False
    factor = rope.get("factor")
    if not _is_number(factor):
        return max_pos, False
    factor = float(factor)
    if factor <= 1.0 or math.isnan(factor) or math.isinf(factor):
        return max_pos, False
    base = max_pos
    if rtype == "yarn":
        orig = rope.get("original_max_position_embeddings")
        if _is_number(orig) and orig > 0:
            if float(orig) >= _MAX_INT_F:
                return max_pos, False
            base = int(float(orig))
    product = float(base) * factor
    if product >= _MAX_INT_F or product < 0:
        return max_pos, False
    return int(product), True


def max_model_len_from_config(hf: HFConfig, infos: list[str], warnings: list[str]) -> int:
    """MaxModelLen from ``max_position_embeddings`` with rope scaling (0 when absent), the
    diagnostics of how it was derived appended to ``infos``/``warnings``."""
    max_pos = hf.get_int("max_position_embeddings", 0)
    if max_pos <= 0:
        return 0
    max_model_len = max_pos
    model_type = hf.get_str("model_type")
    rope = hf.raw.get("rope_scaling")
    scaled, applied = apply_rope_scaling(max_pos, model_type, rope)
    if applied:
        assert isinstance(rope, dict)
        factor = rope.get("factor")
        infos.append(
            f"--latency-model: {_rope_type(rope)} rope_scaling factor {float(factor):.1f}: "
            f"max-model-len {max_pos} -> {scaled}"
        )
        max_model_len = scaled
    elif "gemma3" in model_type:
        infos.append("--latency-model: gemma3 max_position_embeddings is already scaled")
    elif rope is not None:
        if isinstance(rope, dict):
            if "factor" in rope:
                warnings.append(
                    "--latency-model: rope_scaling.factor not applied (excluded rope type, invalid "
                    "factor or overflow); max_position_embeddings used as is"
                )
        else:
            warnings.append("--latency-model: rope_scaling is not a JSON object; ignored")
    infos.append(f"--latency-model: max-model-len={max_model_len} from max_position_embeddings")
    return max_model_len
