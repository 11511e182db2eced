"""A trainer rank of torch's real FSDP2 for tests/python/vllm_driver.py ("trainer": "fsdp"): what `refit publish
--from-safetensors CKPT --layout LAYOUT --rank R --versions K --acks A` does, from live fully_shard shards instead
of a cut of the checkpoint.

    python fsdp_publisher.py '{"rank": R, "world": W, "port": P, "model": CKPT, "registry": REG, "job": J,
                               "versions": K, "acks": A, "hold_ms": H, "layout": "dtensor:dp_shard=F[,tp=T][,ep=E]"}'

Loads CKPT with transformers (bf16) and shards it over W gloo CPU processes: with tp = ep = 1, fully_shard per
decoder layer and at the root over a 1-d mesh; with tp > 1 or ep > 1, transformers 5.19's own distributed code
(transformers_distribute: the model's tp / ep / fsdp plans, as from_pretrained(distributed_config=...) applies
them), then one forward and reshard() (FSDP2's lazy init, which may move a tied parameter's storage, before
binding).  Binds the rank's own shards with refit.fsdp.dtensor (no copy; the layout it derives must be LAYOUT's),
publishes versions 1..K of those bytes (each acknowledged by A readers before the next when A > 0), then holds up
to H ms.
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_skbc_refit")]


def transformers_distribute(model, T, F, E):
    """transformers 5.19's own TP / EP / FSDP2: what from_pretrained(..., distributed_config=DistributedConfig(...))
    does after building the model (mixin.py maybe_distribute_model: the model's tp plan, its ep plan, then
    fully_shard by its fsdp plan) and, for a tied model, after loading (modeling_utils.py _finalize_model_loading:
    tie_weights).  Called on a loaded model because from_pretrained with a distributed_config needs `accelerate`,
    which the vLLM venv does not have; the placements were compared by hand with a real from_pretrained
    (accelerate 1.15.0 in a scratch --target directory): the same (docs/layouts.md)."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.utils import initialize_distributed_mesh
    dc = DistributedConfig(tp_size=T, fsdp_size=F, ep_size=E)
    _, meshes = initialize_distributed_mesh(dc)
    model = type(model).maybe_distribute_model(model, dc, meshes)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model


def warm(model):
    """One forward (FSDP2's lazy init), then reshard() every FSDP module: transformers' fsdp plan keeps its tail
    (embed_tokens / norm / lm_head) unsharded after a forward until the backward."""
    import torch
    from torch.distributed.fsdp import FSDPModule
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def main(a):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM
    import refit
    import refit.fsdp
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a["port"]))
    dist.init_process_group("gloo", rank=a["rank"], world_size=a["world"])
    layout = a.get("layout") or f"dtensor:dp_shard={a['world']}"
    knobs = dict(kv.split("=") for kv in layout.split(":", 1)[1].split(",") if kv)
    F, T, E = (int(knobs.get(k, 1)) for k in ("dp_shard", "tp", "ep"))
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.bfloat16)
    if T > 1 or E > 1:
        model = transformers_distribute(model, T, F, E)
        warm(model)
    else:
        mesh = init_device_mesh("cpu", (a["world"],), mesh_dim_names=("dp_shard",))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    b = refit.fsdp.dtensor(model, refit.Model(a["model"]))
    want = str(refit.Layout(layout))
    if b.layout != want:
        raise SystemExit(f"fsdp_publisher: rank {a['rank']} derived {b.layout}, the driver asked for {want}")
    print(f"fsdp_publisher: rank {a['rank']} {b.layout} rank {b.rank}, {len(b.regions)} regions, refit from "
          f"{refit.__file__}", flush=True)
    with refit.Publisher(b.manifest, registry=a["registry"], job=a["job"]) as pub:
        b.attach(pub)
        for v in range(1, a["versions"] + 1):
            b.publish(pub, v)
            if a["acks"]:
                pub.wait_acks(v, a["acks"], 600000)
        time.sleep(a["hold_ms"] / 1000)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
