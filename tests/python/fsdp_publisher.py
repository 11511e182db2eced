"""A trainer rank of torch's real FSDP2 for tests/python/vllm_driver.py ("trainer": "fsdp"): what `refit publish
--from-safetensors CKPT --layout dtensor:dp_shard=W --rank R --versions K --acks A` does, from live fully_shard
shards instead of a cut of the checkpoint.

    python fsdp_publisher.py '{"rank": R, "world": W, "port": P, "model": CKPT, "registry": REG, "job": J,
                               "versions": K, "acks": A, "hold_ms": H}'

Loads CKPT with transformers (bf16), shards it with fully_shard per decoder layer and at the root over a 1-d
gloo mesh of W CPU processes, binds the rank's own shards with refit.fsdp.dtensor (no copy), publishes versions
1..K of those bytes (each acknowledged by A readers before the next when A > 0), then holds up to H ms.
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_skbc_refit")]


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
    mesh = init_device_mesh("cpu", (a["world"],), mesh_dim_names=("dp_shard",))
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    b = refit.fsdp.dtensor(model, refit.Model(a["model"]))
    print(f"fsdp_publisher: rank {a['rank']} {b.layout} rank {b.rank}, {len(b.regions)} regions", flush=True)
    with refit.Publisher(b.manifest, registry=a["registry"], job=a["job"]) as pub:
        b.attach(pub)
        for v in range(1, a["versions"] + 1):
            b.publish(pub, v)
            if a["acks"]:
                pub.wait_acks(v, a["acks"], 600000)
        time.sleep(a["hold_ms"] / 1000)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
