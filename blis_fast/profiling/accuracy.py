"""Every latency backend's step times against measured GPU steps, by regime (the README's
table is this module's output: ``python -m blis_fast.profiling.accuracy``).

Each measured step (``gpu_profiles/measured/*.json``) is predicted through the public
:func:`blis_fast.step_time` with the model's bundled config.json on the measured GPU, TP 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from blis_fast.api import step_time
from blis_fast.data import data_path
from blis_fast.profiling.calibrate import step_batch

__all__ = ["BACKENDS", "REGIMES", "accuracy_table", "predicted_over_measured", "regime"]

BACKENDS = ("roofline", "trained-physics", "profiled")
REGIMES = ("prefill <= 256 tokens", "prefill 512 tokens", "prefill >= 1024 tokens",
           "decode (1-256 requests)", "mixed prefill + decode")
WITHIN = 0.10  # the table's last row counts the steps within 10% of measured


def regime(row: dict) -> str:
    """The regime of a measured step (a prompt chunk's size, decode only, or both)."""
    if row["prefill_tokens"] and row["decode_batch"]:
        return REGIMES[4]
    if row["decode_batch"]:
        return REGIMES[3]
    if row["prefill_tokens"] <= 256:
        return REGIMES[0]
    return REGIMES[1] if row["prefill_tokens"] <= 512 else REGIMES[2]


def predicted_over_measured(rows: Sequence[dict], backend: str, gpu: str = "H100") -> np.ndarray:
    """Each row's predicted / measured step time under ``backend`` (rows of one GPU)."""
    ratios = []
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        batches = [list(zip(*(a.tolist() for a in step_batch(r)), strict=True)) for r in mine]
        times = step_time(model=model, hardware=gpu, tp=1, latency_model=backend,
                          model_config_folder=str(data_path("model_configs") / model),
                          batches=batches)
        ratios += [(r, t / r["us_median"]) for r, t in zip(mine, times, strict=True)]
    order = {id(r): i for i, r in enumerate(rows)}
    return np.array([q for _, q in sorted(ratios, key=lambda rq: order[id(rq[0])])])


def accuracy_table(path: str | Path) -> str:
    """The markdown table: per regime, each backend's predicted/measured ratio as median
    (min-max), and how many steps each backend puts within 10%."""
    data = json.loads(Path(path).read_text())
    rows = [r for r in data["results"] if "error" not in r]
    ratios = {b: predicted_over_measured(rows, b) for b in BACKENDS}
    regimes = np.array([regime(r) for r in rows])
    lines = ["| regime | steps | " + " | ".join(BACKENDS) + " |",
             "|---|---|" + "---|" * len(BACKENDS)]
    for name in REGIMES:
        sel = regimes == name
        cells = [f"{np.median(ratios[b][sel]):.2f} ({ratios[b][sel].min():.2f}-{ratios[b][sel].max():.2f})"
                 for b in BACKENDS]
        lines.append(f"| {name} | {int(sel.sum())} | " + " | ".join(cells) + " |")
    within = [str(int(np.sum(np.abs(ratios[b] - 1) <= WITHIN))) for b in BACKENDS]
    lines.append(f"| all, within 10% of measured | {len(rows)} | " + " | ".join(within) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table of a measured-steps file (default: the bundled H100 steps)."""
    args = list(sys.argv[1:] if argv is None else argv)
    path = args[0] if args else data_path("gpu_profiles") / "measured" / "h100-steps.json"
    sys.stdout.write(accuracy_table(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
