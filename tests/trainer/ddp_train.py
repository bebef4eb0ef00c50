"""Launched by test_distributed.py under `accelerate launch` with two CPU processes: train a few steps, then save
each rank's parameters so the test can compare them."""

import sys

import torch

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel, end_distributed
from alea_trl.testing import build_tiny_tokenizer, tiny_backbone_config
from alea_trl.trainer.forward import policy as chunked_forward


def main(out_dir: str, train_mode: str, mode: str = "plain") -> None:
    """``mode``: "plain" (3 steps), "chunked" (3 steps, several length-grouped forwards per micro-batch), "save" (4
    steps, a checkpoint every 2), "resume" (from checkpoint-2 to 4), "collectives" (3 steps with the loss's
    collectives: dapo's global sample count, the entropy quantile, the adaptive entropy controller, and the gathered
    completion table)."""
    collectives = (
        dict(
            dense_update="sampled",  # dapo and the entropy quantile act on sampled actions
            loss_type="dapo",
            top_entropy_quantile=0.5,
            use_adaptive_entropy=True,
            entropy_target=100.0,
            entropy_coef_delta=0.01,
            log_completions=True,
        )
        if mode == "collectives"
        else {}
    )
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
        save_strategy="steps" if mode in ("save", "resume") else "no",
        save_steps=2,
        disable_tqdm=True,
        envs=["kelly", "nim"],
        eps_per_env=2,
        max_batch=8,
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=4 if mode in ("save", "resume") else 3,
        # "chunked": two nim decisions (350-500 tokens) share a forward iff both are <= 400 tokens, so the ranks'
        # micro-batches split into different numbers of forwards
        max_len=800 if mode == "chunked" else 1024,
        max_batch_tokens=800 if mode == "chunked" else None,
        logging_steps=1,
        learning_rate=1e-3,
        lr_head=1e-3,
        train_mode=train_mode,
        tail_k=1,
        gradient_checkpointing=True,  # the configuration in which DDP needs every parameter touched each step
        **collectives,
    )
    forwards = []  # length-grouped forwards per loss forward: they differ between the ranks in "chunked" mode
    split = chunked_forward.length_groups

    def counted_split(*a):
        groups = split(*a)
        forwards.append(len(groups))
        return groups

    chunked_forward.length_groups = counted_split
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    init = {n: p.detach().clone() for n, p in unwrapped.named_parameters()}
    trainer.train(resume_from_checkpoint=f"{out_dir}/checkpoint-2" if mode == "resume" else None)
    rank = trainer.accelerator.process_index
    state = {n: p.detach().cpu() for n, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters()}
    torch.save(
        {
            "params": state,
            "init": init,
            "log": trainer.state.log_history,
            "world": trainer.accelerator.num_processes,
            "forwards": forwards,
        },
        f"{out_dir}/rank{rank}.pt",
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_distributed()  # left to interpreter exit, gloo sometimes aborted this script (alea_trl/trainer/distributed.py)
