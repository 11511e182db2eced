"""The FSDP2 side of the example (--trainer fsdp): torch's real fully_shard over gloo on the CPU.

Each trainer rank is a Ray actor (its own process) that joins a gloo process group of W ranks, loads the Hugging
Face checkpoint with transformers (bf16), shards it with fully_shard per decoder layer and at the root over a
1-d mesh, and binds its own shards with refit.fsdp.dtensor: the publisher reads FSDP2's sharded parameter buffers
in place (no gather, no copy, no arena).  Unlike the Megatron-Core trainer (whose forward needs a GPU), this one
takes a real training step on the CPU: forward and backward of transformers' model through FSDP2 (its
all-gathers and reduce-scatters over gloo) on this rank's share of the GRPO batch, a policy-gradient loss
-mean(advantage * log p(completion token)), and an AdamW step that updates the sharded storage in place.

state() gathers the full parameters with DTensor.full_tensor() (a collective on every rank) for the driver's
trainer-side model and native reload only - independently of refit, which never gathers.
"""
import os
import time

LR = 1e-3  # AdamW on bf16 shards: large enough that each step moves bf16 values (a change is asserted)


class FsdpTrainerRank:
    def __init__(self, rank, world, port, model_dir, registry, job):
        import torch
        torch.set_num_threads(1)
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM
        import refit
        import refit.fsdp
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        self.torch, self.dist, self.rank, self.world = torch, dist, rank, world
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        for layer in self.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        t = time.perf_counter()
        self.binding = refit.fsdp.dtensor(self.model, refit.Model(model_dir))
        self.bind_s = time.perf_counter() - t
        self.addr0 = self.binding.addresses()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
        self.pub = refit.Publisher(self.binding.manifest, registry=registry, job=job)
        self.binding.attach(self.pub)
        self.published = 0
        self.last = {}

    def info(self):
        b = self.binding
        own = all(reg.data_ptr() == p._local_tensor.untyped_storage().data_ptr()
                  and reg.numel() == p._local_tensor.untyped_storage().nbytes()
                  for (n, p), reg in zip(b.params.items(), b.regions))
        return {"rank": self.rank, "params": len(b.params), "layout": b.layout, "layout_rank": b.rank,
                "regions": len(b.regions), "region_bytes": sum(r.numel() for r in b.regions),
                "all_params_in_arena": own, "bind_s": self.bind_s}

    def update(self, step, seqs, prompt_lens, advs):
        """One GRPO-shaped step on this rank's share (every world-th sequence) of the batch; returns facts."""
        torch = self.torch
        if self.published:
            self.pub.wait_readers(self.published, 120000)  # in place: readers of the last version are done
        before = {n: p._local_tensor.clone() for n, p in self.binding.params.items()}
        mine = list(range(self.rank, len(seqs), self.world))
        self.model.train()
        t = time.perf_counter()
        ntok = sum(len(seqs[i]) - prompt_lens[i] for i in range(len(seqs)))
        L = max(len(seqs[i]) for i in mine)
        ids = torch.zeros((len(mine), L), dtype=torch.long)
        att = torch.zeros((len(mine), L), dtype=torch.long)
        for j, i in enumerate(mine):  # right-padded: the real tokens keep positions 0..len-1
            ids[j, :len(seqs[i])] = torch.tensor(seqs[i])
            att[j, :len(seqs[i])] = 1
        # one forward and one backward on every rank (FSDP2's all-gathers and reduce-scatters must pair up)
        lp = torch.log_softmax(self.model(input_ids=ids, attention_mask=att).logits.float(), dim=-1)
        loss = torch.zeros((), dtype=torch.float32)
        for j, i in enumerate(mine):
            pl, n = prompt_lens[i], len(seqs[i])
            lpt = lp[j, pl - 1:n - 1].gather(1, ids[j, pl:n, None])[:, 0]
            loss = loss - advs[i] * lpt.sum()
        loss = loss / ntok * self.world  # FSDP2 averages gradients over the world: this makes it the batch mean
        loss.backward()
        total = loss.detach()
        self.opt.step()
        self.opt.zero_grad()
        moved = [n for n, ad in self.binding.addresses().items() if ad != self.addr0[n]]
        changed = sum(int((p._local_tensor != before[n]).sum()) for n, p in self.binding.params.items())
        self.last = {"loss": float(total), "train_s": time.perf_counter() - t, "seqs": len(mine),
                     "elements_changed": changed, "storage_moved": moved}
        return self.last

    def publish(self, version):
        t = time.perf_counter()
        self.binding.publish(self.pub, version)  # sync (copies only past 511 parameters a rank: none here) + publish
        self.published = version
        return time.perf_counter() - t

    def state(self):
        """The full parameters (Hugging Face names) on rank 0, None elsewhere; a collective on every rank."""
        full = {n: p.full_tensor() for n, p in self.model.named_parameters()}
        return full if self.rank == 0 else None

    def die(self):
        os._exit(17)
