"""Run by test_crash_safety.py in a subprocess: train with a checkpoint every step, resuming from the newest complete
checkpoint when asked; optionally SIGKILL itself in the middle of saving checkpoint N (after the weights, before the
commit marker)."""

import os
import signal
import sys

import torch

import alea_trl.trainer.outputs.checkpointing as grpo
from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.testing import build_tiny_tokenizer, tiny_backbone_config


def main(out_dir: str, max_steps: int, resume: bool, kill_at_save: int) -> None:
    if kill_at_save > 0:
        write = grpo._atomic_write

        def dying_write(path, text):
            if f"checkpoint-{kill_at_save}" in path:
                os.kill(os.getpid(), signal.SIGKILL)  # mid-save: weights and pool written, marker not
            write(path, text)

        grpo._atomic_write = dying_write
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = AleaModel.from_backbone(
        tiny_backbone_config(vocab_size=len(tokenizer)), backbone_kwargs={"dtype": torch.float32}
    )
    args = AleaEnvGRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        envs=["kelly", "bandit"],
        eps_per_env=2,
        max_batch=8,
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=2,
        learning_rate=1e-3,
        lr_head=1e-3,
        train_mode="full",
        gradient_checkpointing=False,
        seed=0,
    )
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=True if resume else None)
    torch.save({n: p.detach() for n, p in model.named_parameters()}, os.path.join(out_dir, "final_params.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "resume", int(sys.argv[4]) if len(sys.argv) > 4 else 0)
