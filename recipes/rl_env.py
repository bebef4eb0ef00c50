"""GRPO over environment decision points with AleaEnvGRPOTrainer.

    accelerate launch recipes/rl_env.py --config recipes/configs/quickstart.yaml
    accelerate launch --config_file accelerate_configs/deepspeed_zero2.yaml recipes/rl_env.py \\
        --config recipes/configs/qwen3_0.6b.yaml

Any field of AleaEnvGRPOConfig (and GRPOConfig / TrainingArguments), ModelConfig or ScriptArguments can be set in
the YAML or overridden on the command line (`--max_steps 50 --train_mode lora`). The run trains, evaluates the
policy on every env (greedy, paired with random and oracle play), saves the model with its tokenizer and a model
card holding the evaluation table, and pushes it to the Hub when `push_to_hub` is set.
"""

from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoTokenizer
from trl import ModelConfig, TrlParser, get_peft_config

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.evaluation import format_table
from alea_trl.trainer.distributed import end_distributed
from alea_trl.trainer.model_setup import extra_switches


@dataclass
class ScriptArguments:
    """Arguments of the recipe that are not training settings."""

    init_from_config: bool = field(
        default=False,
        metadata={"help": "Build the backbone from model_name_or_path's config with random weights (offline runs)."},
    )
    final_eval_episodes: int = field(
        default=100, metadata={"help": "Episodes per env of the evaluation after training (0 to skip)."}
    )


def build_model(script_args: ScriptArguments, training_args: AleaEnvGRPOConfig, model_args: ModelConfig):
    """The `model` argument of the trainer: a path / Hub id, or a fresh model around a config-built backbone."""
    if not script_args.init_from_config:
        if model_args.dtype or model_args.attn_implementation:
            training_args.model_init_kwargs = {
                **(training_args.model_init_kwargs or {}),
                **({"dtype": model_args.dtype} if model_args.dtype else {}),
                **({"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}),
            }
        return model_args.model_name_or_path
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    dtype = model_args.dtype if model_args.dtype not in (None, "auto") else torch.float32
    backbone_kwargs = {"dtype": getattr(torch, dtype) if isinstance(dtype, str) else dtype}
    if model_args.attn_implementation:
        backbone_kwargs["attn_implementation"] = model_args.attn_implementation
    return AleaModel.from_backbone(config, backbone_kwargs=backbone_kwargs, **extra_switches(training_args))


def main(script_args: ScriptArguments, training_args: AleaEnvGRPOConfig, model_args: ModelConfig) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    model = build_model(script_args, training_args, model_args)
    peft_config = get_peft_config(model_args)
    if peft_config is not None:
        training_args.train_mode = "lora"
    trainer = AleaEnvGRPOTrainer(model, args=training_args, processing_class=tokenizer, peft_config=peft_config)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    table = {}
    if script_args.final_eval_episodes > 0:
        training_args.eval_episodes = script_args.final_eval_episodes
        trainer.evaluate()
        table = trainer.last_eval_table
        if trainer.accelerator.is_main_process:
            print("\n" + format_table(table))
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(
            model_name=training_args.hub_model_id or training_args.output_dir.rstrip("/").split("/")[-1]
        )
        print(f"saved to {training_args.output_dir}")
    if training_args.push_to_hub:
        trainer.push_to_hub()
    return table


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, AleaEnvGRPOConfig, ModelConfig))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
    end_distributed()  # after main's trainer is gone (see alea_trl/trainer/distributed.py)
