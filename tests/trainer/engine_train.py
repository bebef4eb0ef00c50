"""Launched by test_engines.py: two CPU processes train under a sharded engine, over gloo, with work that differs
between the ranks, save, resume, and record what the test compares.

    python engine_train.py ENGINE OUT_DIR MODE [CHECKPOINT]

``ENGINE`` is ``fsdp`` (accelerate_configs/fsdp.yaml), ``zero2`` or ``zero3`` (accelerate_configs/deepspeed_zero*.yaml).

- DeepSpeed runs as it is on CPU once the process group has a backend: ``ddp_backend="gloo"`` (without it accelerate
  takes none, counts one process, and DeepSpeed's batch check fails; the config refuses that at once).
- accelerate shards with FSDP only on accelerator devices: ``AcceleratorState`` takes its FSDP branch for GPU-like
  distributed types and never for ``MULTI_CPU``. ``fsdp_on_cpu`` sets the state that a GPU launch of the same config
  file would have (distributed type FSDP, the plugin built from the ``FSDP_*`` variables ``accelerate launch``
  exported from the file), so ``Accelerator.prepare`` runs its FSDP2 path (``fully_shard`` per decoder layer, sharded
  optimizer state, distributed state dicts) over gloo.
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
from alea_trl.trainer.distributed import describe_engine, end_distributed


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


def engine_record(trainer, engine: str) -> dict:
    """What the test checks about the engine: the wrapped model's class, DeepSpeed's ZeRO stage, and under ZeRO-3 how
    much of each parameter this rank holds."""
    record = {"model_type": type(trainer.model_wrapped).__name__, "engine": describe_engine(trainer)}
    if engine.startswith("zero"):
        record["zero_stage"] = trainer.model_wrapped.zero_optimization_stage()
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        record["partitions"] = {  # name: (elements held on this rank, elements of the whole parameter)
            n: (p.ds_tensor.numel(), p.ds_numel) for n, p in unwrapped.named_parameters() if hasattr(p, "ds_tensor")
        }
    return record


def main(engine: str, out_dir: str, mode: str, checkpoint: str | None = None) -> None:
    """``mode``: "train" (4 steps, a checkpoint every 2, then evaluate and save), "resume" (from ``checkpoint``, the
    "train" run's checkpoint-2, to step 4 and save), "separate" (2 steps with rollouts in their own forwards),
    "lora" (4 steps of LoRA on the last layer, evaluate and save the adapter)."""
    if engine == "fsdp":
        fsdp_on_cpu()
    tokenizer = build_tiny_tokenizer()
    engine_args = (
        dict(accelerator_config={"use_configured_state": True}) if engine == "fsdp" else dict(ddp_backend="gloo")
    )
    args = AleaEnvGRPOConfig(  # built first: under ZeRO-3 the model below is then built partitioned
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        ddp_timeout=180,  # a collective left unmatched fails the run in minutes instead of hanging it
        report_to="none",
        save_strategy="steps" if mode in ("train", "resume") else "no",
        save_steps=2,
        disable_tqdm=True,
        envs=["kelly", "nim"],  # a dense env, and an outcome env valued by branching (the default)
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
        train_mode="lora" if mode == "lora" else "full",
        tail_k=1,
        # 9 episodes of each env on rank 0, 8 on rank 1: a wave of 9 decisions of one env takes two forwards of
        # max_batch 8, a wave of 8 one, so the ranks run different numbers of evaluation forwards
        eval_episodes=17,
        **engine_args,
    )
    torch.manual_seed(0)
    model = AleaModel.from_backbone(
        tiny_backbone_config(vocab_size=len(tokenizer)), backbone_kwargs={"dtype": torch.float32}
    )
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    assert trainer.even_forwards.enabled == (engine != "zero2")  # ZeRO-2 keeps whole parameters on every rank
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    counts = {"policy": 0, "reference": 0}
    unwrapped.register_forward_pre_hook(lambda *_: counts.__setitem__("policy", counts["policy"] + 1))
    if trainer.ref_model is not None:
        trainer.ref_model.register_forward_pre_hook(
            lambda *_: counts.__setitem__("reference", counts["reference"] + 1)
        )
    trainer.train(resume_from_checkpoint=checkpoint if mode == "resume" else None)
    before_eval = trainer.even_forwards.dummy_forwards
    if mode in ("train", "lora"):
        trainer.evaluate()
    eval_dummies = trainer.even_forwards.dummy_forwards - before_eval
    final = f"{out_dir}/final"
    trainer.save_model(final)
    inputs = probe_inputs(tokenizer)
    with torch.no_grad():
        logits = unwrapped.eval()(**inputs).choice_logits  # every rank runs it: the parameters may be sharded
    rank = trainer.accelerator.process_index
    record = {
        "counts": counts,
        "dummy_forwards": trainer.even_forwards.dummy_forwards,
        "eval_dummy_forwards": eval_dummies,
        "log": trainer.state.log_history,
        "inputs": inputs,
        "choice_logits": logits,
        "world": trainer.accelerator.num_processes,
        **engine_record(trainer, engine),
    }
    torch.save(record, f"{out_dir}/rank{rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_distributed()
