"""Launched by test_engines.py: two CPU processes train under FSDP2 (accelerate_configs/fsdp.yaml, over gloo) with work
that differs between the ranks, save, resume, and record what the test compares.

accelerate shards with FSDP only on accelerator devices: ``AcceleratorState`` takes its FSDP branch for GPU-like
distributed types and never for ``MULTI_CPU``, and DeepSpeed likewise needs ``cpu=False``. ``fsdp_on_cpu`` sets the
state that a GPU launch of the same config file would have (distributed type FSDP, the plugin built from the
``FSDP_*`` variables ``accelerate launch`` exported from the file), so ``Accelerator.prepare`` runs its FSDP2 path
(``fully_shard`` per decoder layer, sharded optimizer state, distributed state dicts) over gloo.
"""

import sys

import numpy as np
import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.collate import collate_segments, pad_token_id
from alea_trl.envs import env_factories
from alea_trl.packing import pack_request
from alea_trl.testing import build_tiny_tokenizer, tiny_backbone_config
from alea_trl.trainer.distributed import end_distributed


def fsdp_on_cpu() -> None:
    state = Accelerator(cpu=True).state
    plugin = FullyShardedDataParallelPlugin()  # from the FSDP_* variables of the launch
    PartialState().distributed_type = state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin


def probe_inputs(tokenizer) -> dict:
    """Model inputs of fixed decisions (kelly and nim, first decision of seed 7) for the reload comparison."""
    packed = []
    for name, factory in env_factories(["kelly", "nim"]).items():
        env = factory()
        env.reset(np.random.default_rng(7))
        decision = env.observe()
        packed.append(pack_request(tokenizer, decision.state, decision.questions, max_len=1024, env=name))
    return dict(collate_segments(packed, pad_token_id(tokenizer)).model_inputs())


def main(out_dir: str, mode: str) -> None:
    """``mode``: "train" (4 steps, a checkpoint every 2, then evaluate and save), "resume" (from the "train" run's
    checkpoint-2, given as a third argument, to step 4 and save), "separate" (2 steps with rollouts in their own
    forwards)."""
    fsdp_on_cpu()
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = AleaModel.from_backbone(
        tiny_backbone_config(vocab_size=len(tokenizer)), backbone_kwargs={"dtype": torch.float32}
    )
    args = AleaEnvGRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        accelerator_config={"use_configured_state": True},
        ddp_timeout=180,  # a collective left unmatched fails the run in minutes instead of hanging it
        report_to="none",
        save_strategy="no" if mode == "separate" else "steps",
        save_steps=2,
        disable_tqdm=True,
        envs=["kelly", "nim"],
        eps_per_env=2,
        max_batch=8,
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=2 if mode == "separate" else 4,
        sample_in_loss_forward=mode != "separate",
        # two nim decisions (350-500 tokens) share a forward only if both are <= 400 tokens: the ranks' micro-batches
        # split into different numbers of forwards; nim's branch continuations differ between the ranks too
        max_len=800,
        max_batch_tokens=800,
        beta=0.05,
        logging_steps=1,
        learning_rate=1e-3,
        lr_head=1e-3,
        train_mode="full",
        eval_episodes=3,  # 2 episodes on rank 0, 1 on rank 1
    )
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    assert trainer.is_fsdp_enabled and trainer.even_forwards.enabled
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    counts = {"policy": 0, "reference": 0}
    unwrapped.register_forward_pre_hook(lambda *_: counts.__setitem__("policy", counts["policy"] + 1))
    trainer.ref_model.register_forward_pre_hook(lambda *_: counts.__setitem__("reference", counts["reference"] + 1))
    trainer.train(resume_from_checkpoint=sys.argv[3] if mode == "resume" else None)
    if mode == "train":
        trainer.evaluate()
    final = f"{out_dir}/final"
    trainer.save_model(final)
    inputs = probe_inputs(tokenizer)
    with torch.no_grad():
        logits = unwrapped.eval()(**inputs).choice_logits  # every rank runs it: the parameters are sharded
    rank = trainer.accelerator.process_index
    record = {
        "counts": counts,
        "dummy_forwards": trainer.even_forwards.dummy_forwards,
        "log": trainer.state.log_history,
        "inputs": inputs,
        "choice_logits": logits,
        "model_type": type(trainer.model).__name__,
    }
    torch.save(record, f"{out_dir}/rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_distributed()
