"""The trainer side of the asynchronous example: grpo_ray's trainer ranks (examples/grpo_ray/run.py's TrainerRank,
megatron-core tp=2 with a seeded update; fsdp_trainer.py's FsdpTrainerRank, torch fully_shard with a real AdamW
step), each with one more method, `step`, that trains on a batch and publishes the next version in one actor call
and says when it was busy (wall-clock), so that the driver can tell the rollout's decode steps that ran beside
the trainer's work from those that did not.
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "grpo_ray"))

from fsdp_trainer import FsdpTrainerRank  # noqa: E402  examples/grpo_ray
from run import TrainerRank  # noqa: E402  examples/grpo_ray/run.py (its main() is not run on import)


class MegatronAsyncTrainer(TrainerRank):
    def step(self, step, version, scale, seqs=None, prompt_lens=None, advs=None):
        t0 = time.time()
        self.update(step, scale)  # waits for the readers of the last version first (the arena is updated in place)
        t1 = time.time()
        pub_s = self.publish(version)
        return {"rank": self.rank, "busy": [t0, time.time()], "update_s": t1 - t0, "publish_s": pub_s}


class FsdpAsyncTrainer(FsdpTrainerRank):
    def step(self, step, version, scale, seqs=None, prompt_lens=None, advs=None):
        t0 = time.time()
        facts = self.update(step, seqs, prompt_lens, advs)
        t1 = time.time()
        pub_s = self.publish(version)
        return {"rank": self.rank, "busy": [t0, time.time()], "update_s": t1 - t0, "publish_s": pub_s,
                "train": facts}
