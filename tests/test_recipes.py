"""The extension recipes of docs/extending.md, followed to the letter on a copy of the package.

Each recipe below is the list of edits its section of docs/extending.md prescribes, for a
throwaway member: a stateless scorer, a stateful scorer, a built-in admission policy with a
parameter, a scheduler, a latency backend and a flag that reaches the engine. The first test
counts the package files each recipe touches (the issue's targets); the second applies every
recipe to one copy of the package, runs it in a child process (the copied kernels compile
once) and checks that each new member is accepted by name and changes what a run produces.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ("defaults.yaml", "hardware_config.json", "model_configs")


@dataclass(frozen=True)
class Edit:
    """One edit of one package file: ``change(text) -> new text`` (fails if its anchor is gone)."""

    path: str  # relative to the repository root
    change: Callable[[str], str]


@dataclass(frozen=True)
class Regenerate:
    """A generated package file rewritten by its generator (``python -m <module>``, run on the
    copy) after the edits before it: a command to run, not a file edited by hand."""

    path: str  # relative to the repository root
    module: str


def insert(path: str, anchor: str, text: str, *, after: bool = False) -> Edit:
    """Put ``text`` before (or after) the one match of the regex ``anchor`` in ``path``."""

    def change(source: str) -> str:
        found = list(re.finditer(anchor, source, re.M))
        assert len(found) == 1, f"{path}: {anchor!r} matches {len(found)} times"
        at = found[0].end() if after else found[0].start()
        return source[:at] + text + source[at:]

    return Edit(path, change)


def append(path: str, text: str) -> Edit:
    """Add ``text`` at the end of ``path``."""
    return Edit(path, lambda source: source + text)


def add_member(path: str, enum: str, name: str) -> Edit:
    """Add ``name`` to the NamedTuple enum class ``enum``: before ``SIZE`` (which moves up one)
    or before a member marking a range (``TABLE_BASE``) if there is one, else after the last."""

    def change(source: str) -> str:
        body = re.search(rf"^class {enum}\(NamedTuple\):\n(.*?)\n\n\n", source, re.M | re.S)
        assert body, f"{path}: no class {enum}"
        members = [(m, int(v)) for m, v in
                   re.findall(r"^    ([A-Z_0-9]+): int = (\d+)", body.group(1), re.M)]
        values = dict(members)
        stop = next((m for m in ("SIZE", "TABLE_BASE") if m in values), None)
        value = values[stop] if stop == "SIZE" else max(v for m, v in members if m != stop) + 1
        block = body.group(1)
        line = f"    {name}: int = {value}\n"
        if stop is None:
            block += "\n" + line.rstrip("\n")
        else:
            at = re.search(rf"^    {stop}: int = ", block, re.M).start()
            block = block[:at] + line + block[at:]
            if stop == "SIZE":
                block = re.sub(r"^    SIZE: int = \d+", f"    SIZE: int = {value + 1}", block,
                               flags=re.M)
        return source[:body.start(1)] + block + source[body.end(1):]

    return Edit(path, change)


# ------------------------------------------------------------------------------ the recipes

STATELESS_SCORER = (
    append("blis_fast/kernels/cluster/scorers.py", '''

@cfunc(SCORER_SIG, cache=True)
def score_prefer_last(snapshots, request, out):
    """Throwaway scorer of tests/test_recipes.py: the last instance only."""
    n = snapshots.shape[0]
    for i in range(n):
        out[i] = 1.0 if i == n - 1 else 0.0
'''),
    append("blis_fast/policies/scorers.py",
           'SCORERS.register(Scorer("prefer-last", reads_cache=False, '
           'function=S.score_prefer_last))\n'),
)

STATEFUL_SCORER = (
    add_member("blis_fast/kernels/cluster/router_state.py", "RouterVarT", "ROTATION"),
    add_member("blis_fast/kernels/enums.py", "StatefulScorerT", "ROTATING"),
    insert("blis_fast/kernels/cluster/scorers.py", r"^    else:\n        _score_no_hit_lru\(", '''\
    elif code == StatefulScorer.ROTATING:
        turn = rt.st[RouterVar.ROTATION]
        for i in range(n):
            rt.dim[i] = 1.0 if i == turn % n else 0.0
        rt.st[RouterVar.ROTATION] = turn + 1
'''),
    Edit("blis_fast/kernels/cluster/scorers.py",
         lambda s: s.replace("<= code <= StatefulScorer.LORA_AFFINITY",
                             "<= code <= StatefulScorer.ROTATING")),
    append("blis_fast/policies/scorers.py",
           'SCORERS.register(Scorer("rotating", reads_cache=False, '
           'code=StatefulScorer.ROTATING))\n'),
)

ADMISSION_WITH_PARAMETER = (
    add_member("blis_fast/kernels/cluster/admission.py", "AdmissionT", "SHED_LONG"),
    add_member("blis_fast/kernels/cluster/admission.py", "AdmissionReasonT", "TOO_LONG"),
    add_member("blis_fast/kernels/cluster/admission.py", "RouterParamT", "MAX_INPUT"),
    append("blis_fast/policies/admission.py", '''
ADMISSION.register(Policy("shed-long", Admission.SHED_LONG, params=(
    Param("max_input", float, "RouterParam.MAX_INPUT", default=400.0,
          bundle_check=finite_positive("{flag} must be a finite value > 0, got {value}")),
), reason="too-long", reason_code=AdmissionReason.TOO_LONG))
'''),
    insert("blis_fast/kernels/cluster/admission.py", r"^    elif code == Admission.CUSTOM:\n", '''\
    elif code == Admission.SHED_LONG:
        if np.float64(input_len) > rt.rfl[RouterParam.MAX_INPUT]:
            return False, AdmissionReason.TOO_LONG
'''),
)

SCHEDULER = (
    add_member("blis_fast/kernels/engine/batch.py", "SchedulerT", "LONGEST_FIRST"),
    append("blis_fast/policies/scheduler.py",
           'SCHEDULER.register(Policy("longest-first", Scheduler.LONGEST_FIRST))\n'),
    insert("blis_fast/kernels/engine/batch.py", r"^    elif code == Scheduler.CUSTOM:\n", '''\
    elif code == Scheduler.LONGEST_FIRST:
        if inp.input_len[a] != inp.input_len[b]:
            return inp.input_len[a] > inp.input_len[b]
'''),
)

LATENCY_BACKEND = (
    add_member("blis_fast/kernels/engine/latency.py", "BackendT", "PER_TOKEN"),
    insert("blis_fast/kernels/engine/latency.py", r"^# -+ dispatch\n", '''\
PT_BASE, PT_PER_TOKEN = 0, 1
PT_SIZE = 2


@njit(cache=True, _nrt=False, error_model="numpy")
def _per_token_step(params, n, progress, new_tokens, input_len, output_len) -> np.int64:
    tokens = np.int64(0)
    for i in range(n):
        tokens += new_tokens[i]
    return max(np.int64(1), clamp_to_int64(params[PT_BASE] + params[PT_PER_TOKEN] * tokens))


'''),
    insert("blis_fast/kernels/engine/latency.py",
           r"^    return np.int64\(-1\)  # unknown backend", '''\
    if code == Backend.PER_TOKEN:
        return _per_token_step(params, n, progress, new_tokens, input_len, output_len)
'''),
    append("blis_fast/config/latency_backends.py", '''

def _pack_per_token(alpha, beta, mc, hc, tp, warnings):
    if len(beta) < K.PT_SIZE:
        raise BlisConfigError(f"--beta-coeffs: per-token needs {K.PT_SIZE} betas, got {len(beta)}")
    check_coefficients("--beta-coeffs", beta)
    return np.array(beta[:K.PT_SIZE], dtype=np.float64)


LATENCY_BACKENDS.register(Backend("per-token", BackendCode.PER_TOKEN, _pack_per_token,
                                  analytical=False))
'''),
)

ENGINE_FLAG = (
    add_member("blis_fast/kernels/engine/state.py", "ConfigSlotT", "EXTRA_ADMISSION_DELAY"),
    insert("blis_fast/options.py", r'^        OptionSpec\("routing-latency", ', '''\
        OptionSpec("extra-admission-delay", "int", 0, "added admission delay (µs)", _DELAY,
                   slot="ConfigSlot.EXTRA_ADMISSION_DELAY"),
'''),
    Edit("blis_fast/options.py",
         lambda s: s.replace('"admission-latency", "routing-latency")',
                             '"admission-latency", "routing-latency", "extra-admission-delay")')),
    Regenerate("blis_fast/run_options.py", "blis_fast.run_options_codegen"),
    Edit("blis_fast/kernels/engine/event_loop.py",
         lambda s: s.replace("t + cfg.ints[ConfigSlot.ADMISSION_LATENCY]",
                             "t + cfg.ints[ConfigSlot.ADMISSION_LATENCY]"
                             " + cfg.ints[ConfigSlot.EXTRA_ADMISSION_DELAY]")),
)

RECIPES = {
    "stateless scorer": STATELESS_SCORER,
    "stateful scorer": STATEFUL_SCORER,
    "admission policy with a parameter": ADMISSION_WITH_PARAMETER,
    "scheduler": SCHEDULER,
    "latency backend": LATENCY_BACKEND,
    "engine flag": ENGINE_FLAG,
}

PACKAGE_FILES_AT_MOST = {
    "stateless scorer": 2,
    "admission policy with a parameter": 2,  # plus its test: the 3
    "latency backend": 2,  # plus its test (and defaults.py/.yaml for a new coefficients section)
    "engine flag": 3,  # plus its test: the slot is declared in kernels/engine/state.py (issue 26)
}
"""The issue's touch-point targets, in package files edited by hand (each recipe's test is one
more; a file its generator rewrites is not counted)."""


def _apply(root: Path, edits) -> None:
    for edit in edits:
        path = root / edit.path
        before = path.read_text()
        if isinstance(edit, Regenerate):
            subprocess.run([sys.executable, "-m", edit.module], cwd=root, check=True,
                           env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True)
            after = path.read_text()
        else:
            after = edit.change(before)
            path.write_text(after)
        assert after != before, f"{edit.path}: the recipe's edit found nothing to change"


def _copy_package(tmp: Path, *, caches: bool) -> Path:
    """A copy of the package and its data files under ``tmp``; with ``caches``, Numba's caches
    too (``copytree`` keeps the files' times, so a cache stays valid for an unedited file)."""
    skip = ("*.pyc",) if caches else ("__pycache__",)
    shutil.copytree(ROOT / "blis_fast", tmp / "blis_fast", ignore=shutil.ignore_patterns(*skip))
    for name in DATA:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp / name)
        elif src.is_file():
            shutil.copy2(src, tmp / name)
    return tmp


def test_each_recipe_touches_few_files(tmp_path):
    touched = {name: sorted({e.path for e in edits if isinstance(e, Edit)})
               for name, edits in RECIPES.items()}
    regenerated = {name: sorted({e.path for e in edits if isinstance(e, Regenerate)})
                   for name, edits in RECIPES.items()}
    root = _copy_package(tmp_path, caches=False)
    for edits in RECIPES.values():
        _apply(root, edits)  # every anchor still exists, every edit changes its file
    for path in sorted({e.path for edits in RECIPES.values() for e in edits}):
        compile((root / path).read_text(), path, "exec")  # each edit left valid Python
    for name, limit in PACKAGE_FILES_AT_MOST.items():
        assert len(touched[name]) <= limit, (name, touched[name])
    assert touched["stateless scorer"] == ["blis_fast/kernels/cluster/scorers.py",
                                           "blis_fast/policies/scorers.py"]
    assert touched["admission policy with a parameter"] == [
        "blis_fast/kernels/cluster/admission.py", "blis_fast/policies/admission.py"]
    assert touched["engine flag"] == ["blis_fast/kernels/engine/event_loop.py",
                                      "blis_fast/kernels/engine/state.py", "blis_fast/options.py"]
    assert regenerated == {**{name: [] for name in RECIPES},
                           "engine flag": ["blis_fast/run_options.py"]}
    assert "extra_admission_delay: int = 0" in (root / "blis_fast/run_options.py").read_text()


CHILD = r'''
import json, sys
import numpy as np
import blis_fast
from pathlib import Path

assert blis_fast.__file__.startswith(sys.argv[1]), blis_fast.__file__
BASE = dict(model="meta-llama/llama-3.1-8b-instruct", num_instances=3, rate=60,
            num_requests=120, total_kv_blocks=3000, log="error", seed=3)
def run(**kw):
    return blis_fast.run(**{**BASE, **kw})
def facts(r):
    return {"stdout": r.stdout, "handled_by": np.asarray(r.requests.handled_by).tolist(),
            "rejected": int(r.simulation.rejected_admission),
            "inputs": np.asarray(r.requests.num_prefill_tokens).tolist()}
bundle = Path(sys.argv[2])
bundle.write_text("admission:\n  policy: shed-long\n  max_input: 100000\n")
out = {
    "base": facts(run()),
    "weighted": facts(run(routing_policy="weighted", routing_scorers="queue-depth:1")),
    "prefer-last": facts(run(routing_policy="weighted", routing_scorers="prefer-last:1")),
    "rotating": facts(run(routing_policy="weighted", routing_scorers="rotating:1")),
    "shed-long": facts(run(admission_policy="shed-long")),
    "shed-long-bundle": facts(run(policy_config=str(bundle))),
    "fcfs-1": facts(run(num_instances=1, rate=200, max_num_running_reqs=2)),
    "longest-first-1": facts(run(num_instances=1, rate=200, max_num_running_reqs=2,
                                 scheduler="longest-first")),
    "blackbox": facts(run(latency_model="blackbox", alpha_coeffs=(100.0, 1.0, 0.0),
                      beta_coeffs=(1000.0, 10.0, 5.0))),
    "per-token": facts(run(latency_model="per-token", alpha_coeffs=(100.0, 1.0, 0.0),
                      beta_coeffs=(1000.0, 10.0))),
    "delayed": facts(run(extra_admission_delay=50000)),
}
print(json.dumps(out))
'''

@pytest.mark.slow
def test_recipes_add_members_that_change_a_run(tmp_path):
    root = _copy_package(tmp_path / "pkg", caches=True)
    for edits in RECIPES.values():
        _apply(root, edits)
    # no cache is dropped by hand: the edits change the kernels' sources, which every cached
    # kernel's key digests (kernels/jit.py), so the copy compiles what they change
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, "-c", CHILD, str(root), str(tmp_path / "b.yaml")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stderr[-4000:]
    runs = json.loads(res.stdout.strip().splitlines()[-1])
    base = runs["base"]
    # stateless scorer: every request to the last instance
    assert set(runs["prefer-last"]["handled_by"]) == {2}
    # stateful scorer: its state turns the choice round, unlike queue-depth
    assert runs["rotating"]["handled_by"] != runs["weighted"]["handled_by"]
    assert sorted(set(runs["rotating"]["handled_by"])) == [0, 1, 2]
    # admission policy: refuses inputs over its parameter's default, a bundle value reaches it
    shed = runs["shed-long"]
    assert shed["rejected"] > 0 and max(shed["inputs"]) <= 400
    assert shed["rejected"] == sum(x > 400 for x in base["inputs"])
    assert runs["shed-long-bundle"]["rejected"] == 0
    assert runs["shed-long-bundle"]["stdout"] == base["stdout"]
    # scheduler: a queue ordered longest first changes the schedule
    assert runs["longest-first-1"]["stdout"] != runs["fcfs-1"]["stdout"]
    # latency backend: runs with its own step times
    assert runs["per-token"]["stdout"] != runs["blackbox"]["stdout"]
    assert runs["per-token"]["rejected"] == 0
    # engine flag: a delay before admission lengthens every request's latency
    assert runs["delayed"]["stdout"] != base["stdout"]
