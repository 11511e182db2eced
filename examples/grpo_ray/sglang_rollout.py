"""The SGLang side of the example (run.py --rollout sglang): a real SGLang 0.5.23 engine (CPU, tp=1) refitted through
refit.sglang, behind the same methods as rollout.Engine (the vLLM side).

SGLang needs its own venv (torch 2.14.1, transformers 5.19; scripts/sglang-venv.sh) while the driver, the trainer
ranks and this proxy run in the vLLM venv (torch 2.13, ray, megatron-core).  So SglangEngine, the class run.py wraps
in a Ray actor, starts this file under the SGLang venv's python as a child process (`python sglang_rollout.py
--serve SOCKET`) and drives it over a local socket (multiprocessing.connection, AF_UNIX, a random authkey passed
through the environment).  What crosses the socket is plain Python data (token ids, log-probabilities, reports) and,
for SGLang's own update path (the swap-only comparison), the tensors as safetensors bytes: a torch tensor sent
through a multiprocessing connection is pickled by torch's reducer as a shared-memory file descriptor that the
receiver fetches from the sender's resource sharer, which authenticates with the *process's* authkey, and two
processes started apart have different ones (AuthenticationError).

The child runs SGLang as tests/python/test_sglang.py does: SGLANG_USE_CPU_ENGINE=1, refit's stand-in sgl_kernel
(tests/python/sglang_stub, first on PYTHONPATH: PyPI has no CPU build of SGLang's kernel package; SGLang imports
names from it and calls none on this path), attention_backend torch_native, sampling_backend pytorch.

    SglangEngine(path, refit=True)   sglang.Engine(..., **refit.sglang.engine_args()) in the child; refit=False: a
                                     plain SGLang (the native reload and the swap-only comparison)
    generate(prompts, n, seed, max_tokens)  sampled completions (temperature 1, each prompt n times); SGLang's
                                     sampling is not seeded per request here (seed is unused): the KL gate scores
                                     the same sampled sequences on every engine, so it does not need replay
    score(seqs, prompt_lens)         SGLang's log-probability of every completion token, from its forward pass on
                                     prompt + completion (return_logprob, logprob_start_len=0: input_token_logprobs)
    refit_to(version)                RefitSglang.update(version): begin_weight_update, refit's custom loader in the
                                     worker, end_weight_update
    load_weights(tensors)            SGLang's own update_weights_from_tensor between begin/end_weight_update
"""
import os
import secrets
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
STUB = os.path.join(ROOT, "tests", "python", "sglang_stub")


def sglang_python() -> str:
    """The SGLang venv's python: $REFIT_SGLANG_PYTHON, else $REFIT_SGLANG_VENV/bin/python, else what
    scripts/sglang-venv.sh prints (it builds the venv once, about 7 GB)."""
    if os.environ.get("REFIT_SGLANG_PYTHON"):
        return os.environ["REFIT_SGLANG_PYTHON"]
    venv = os.environ.get("REFIT_SGLANG_VENV")
    if venv and os.path.isfile(os.path.join(venv, "bin", "python")):
        return os.path.join(venv, "bin", "python")
    return subprocess.run([os.path.join(ROOT, "scripts", "sglang-venv.sh")], check=True, stdout=subprocess.PIPE,
                          text=True).stdout.strip()


class SglangRolloutError(RuntimeError):
    """An error of the SGLang child, its type and message as the child raised them."""


class SglangEngine:
    """The proxy (vLLM venv): rollout.Engine's methods, each a call into the SGLang child."""

    def __init__(self, path: str, refit: bool = True, max_model_len: int = 128, env: dict = None,
                 python: str = None, start_timeout_s: float = 600):
        from multiprocessing.connection import Client
        self._dir = tempfile.mkdtemp(prefix="refit-sglang-rollout-")
        addr = os.path.join(self._dir, "sock")
        key = secrets.token_bytes(32)
        cenv = dict(os.environ, **(env or {}))
        cenv["REFIT_ROLLOUT_KEY"] = key.hex()
        cenv["SGLANG_USE_CPU_ENGINE"] = "1"
        cenv["PYTHONPATH"] = os.pathsep.join([STUB, HERE] + [p for p in cenv.get("PYTHONPATH", "").split(os.pathsep)
                                                             if p and p != STUB])
        self.log_path = os.path.join(self._dir, "child.log")
        self._log = open(self.log_path, "w")
        t = time.perf_counter()
        self.proc = subprocess.Popen([python or sglang_python(), os.path.abspath(__file__), "--serve", addr],
                                     env=cenv, stdout=self._log, stderr=subprocess.STDOUT)
        self.conn = None
        while self.conn is None:
            if self.proc.poll() is not None:
                raise SglangRolloutError(f"the SGLang child exited ({self.proc.returncode}) before it listened: "
                                         + self._tail())
            if time.perf_counter() - t > start_timeout_s:
                self.proc.kill()
                raise SglangRolloutError(f"the SGLang child did not listen within {start_timeout_s} s")
            try:
                self.conn = Client(addr, family="AF_UNIX", authkey=key)
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.2)
        self.info = self._call("start", path=path, refit=refit, max_model_len=max_model_len)
        self.start_s = time.perf_counter() - t
        self.refit = refit

    def _tail(self, n=3000):
        try:
            self._log.flush()
            return open(self.log_path, errors="replace").read()[-n:]
        except OSError:
            return ""

    def _call(self, op, **kw):
        try:
            self.conn.send((op, kw))
            ok, val = self.conn.recv()
        except (EOFError, OSError) as e:
            raise SglangRolloutError(f"the SGLang child is gone ({e}, exit {self.proc.poll()}): {self._tail()}")
        if not ok:
            raise SglangRolloutError(val)
        return val

    def ready(self) -> float:
        return self.start_s

    def versions(self) -> dict:
        return self.info

    def init_transfer(self, init_info: dict):
        return self._call("init_transfer", info=init_info)

    def generate(self, prompts, n: int, seed: int, max_tokens: int):
        return self._call("generate", prompts=[list(p) for p in prompts], n=n, max_tokens=max_tokens)

    def score(self, seqs, prompt_lens):
        return self._call("score", seqs=[list(s) for s in seqs], prompt_lens=list(prompt_lens))["logprobs"]

    def score_detail(self, seqs, prompt_lens):
        """score() plus the token ids SGLang reported beside each log-probability (see Server.score)."""
        return self._call("score", seqs=[list(s) for s in seqs], prompt_lens=list(prompt_lens))

    def refit_to(self, version, timeout_ms: int = None):
        """One refit; returns seconds (RefitSglang.update: begin .. end) and TP rank 0's report."""
        return self._call("refit_to", version=version)

    def load_weights(self, tensors: dict):
        """SGLang's own update path for Hugging Face tensors (sent as safetensors bytes): returns seconds, the
        serialization included."""
        from safetensors.torch import save
        t = time.perf_counter()
        data = save({k: v.contiguous() for k, v in tensors.items()})
        return self._call("load_weights", data=data) + (time.perf_counter() - t)

    def shutdown(self):
        if self.proc.poll() is None:
            try:
                self._call("shutdown")
            except SglangRolloutError:
                pass
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return True


class SglangNativeScorer:
    """Starts a plain SGLang from a checkpoint directory, scores, stops it (a new engine every call)."""

    def score_fresh(self, path, seqs, prompt_lens):
        e = SglangEngine(path, refit=False)
        try:
            return e.score(seqs, prompt_lens), e.start_s
        finally:
            e.shutdown()


# ---------------------------------------------------------------- the child (SGLang venv)


class Server:
    def __init__(self, path, refit, max_model_len):
        import sglang
        import torch
        from refit.sglang import engine_args
        kw = engine_args() if refit else {}
        self.eng = sglang.Engine(model_path=path, tp_size=1, device="cpu", attention_backend="torch_native",
                                 sampling_backend="pytorch", skip_tokenizer_init=True, disable_overlap_schedule=True,
                                 disable_cuda_graph=True, dtype="bfloat16", random_seed=0,
                                 context_length=max_model_len, max_total_tokens=4096, max_running_requests=16,
                                 mem_fraction_static=0.5, log_level="warning", **kw)
        import json
        self.vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
        self.rs = None
        import refit as refit_pkg
        self.info = {"sglang": sglang.__version__, "torch": torch.__version__,
                     "refit": os.path.dirname(os.path.abspath(refit_pkg.__file__))}

    def init_transfer(self, info):
        from refit.sglang import RefitSglang
        if self.rs is not None:
            self.rs.close()
        self.rs = RefitSglang(self.eng, registry=info["registry"], job=info["job"],
                              timeout_ms=int(info.get("timeout_ms", 60000)))
        return True

    def generate(self, prompts, n, max_tokens):
        sp = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": max_tokens, "ignore_eos": True}
        outs = self.eng.generate(input_ids=[p for p in prompts for _ in range(n)], sampling_params=sp)
        ids = [list(o["output_ids"]) for o in outs]
        return [ids[i * n:(i + 1) * n] for i in range(len(prompts))]

    def score(self, seqs, prompt_lens):
        """SGLang's log-probabilities of every token after the prompt (input_token_logprobs: (logprob, token id,
        text) per position, None at position 0).  Finding (SGLang 0.5.23, logprob_result_processor.py): the token
        id it reports beside each input log-probability is clipped to 0 for ids >= vocab_size - 1 (meant for padded
        image-token hashes); the log-probability is the token's own.  The ids are returned so that run.py can check
        exactly that."""
        outs = self.eng.generate(input_ids=[list(s) for s in seqs],
                                 sampling_params={"temperature": 1.0, "max_new_tokens": 1},
                                 return_logprob=True, logprob_start_len=0)
        lps, ids = [], []
        for s, pl, o in zip(seqs, prompt_lens, outs):
            itl = o["meta_info"]["input_token_logprobs"]
            lps.append([float(itl[i][0]) for i in range(pl, len(s))])
            ids.append([int(itl[i][1]) for i in range(pl, len(s))])
        return {"logprobs": lps, "ids": ids, "vocab_size": self.vocab}

    def refit_to(self, version):
        t = time.perf_counter()
        doc = self.rs.update(version)
        dt = time.perf_counter() - t
        rep = dict(doc["workers"][0]["report"])
        rep["apply_total_ms"] = rep.get("apply_ms")
        rep["driver"] = doc["driver"]
        return dt, rep

    def load_weights(self, data):
        from safetensors.torch import load
        tensors = load(data)
        t = time.perf_counter()
        self.eng.begin_weight_update()
        try:
            ok, msg = self.eng.update_weights_from_tensor(named_tensors=list(tensors.items()), flush_cache=True)
        finally:
            self.eng.end_weight_update()
        if not ok:
            raise RuntimeError(f"update_weights_from_tensor: {msg}")
        return time.perf_counter() - t

    def shutdown(self):
        if self.rs is not None:
            self.rs.close()
        self.eng.shutdown()
        return True


def serve(addr):
    """The child's loop: the first message starts the engine; every message (op, kwargs) is answered (True,
    value) or (False, "Type: message"); EOF (the proxy is gone) shuts the engine down."""
    import ctypes
    import signal
    import traceback
    from multiprocessing.connection import Listener
    try:  # die with the proxy (a Ray actor killed at ray.shutdown) rather than leave SGLang running
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    sys.path[:0] = [STUB]
    key = bytes.fromhex(os.environ.pop("REFIT_ROLLOUT_KEY"))
    listener = Listener(addr, family="AF_UNIX", authkey=key)
    conn = listener.accept()
    srv = None
    while True:
        try:
            op, kw = conn.recv()
        except (EOFError, OSError):
            break
        try:
            if op == "start":
                srv = Server(**kw)
                val = srv.info
            else:
                val = getattr(srv, op)(**kw)
            conn.send((True, val))
        except Exception as e:
            conn.send((False, f"{type(e).__name__}: {e}" + ("" if str(e) else traceback.format_exc()[-1500:])))
        if op == "shutdown":
            srv = None
            break
    if srv is not None:
        try:
            srv.shutdown()
        except Exception:
            pass
    conn.close()
    listener.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
        sys.stdout.flush()
        os._exit(0)
    print(__doc__)
