"""GRPO over environment decision points with AleaEnvGRPOTrainer.

    accelerate launch recipes/rl_env.py --config recipes/configs/quickstart.yaml
    accelerate launch --config_file accelerate_configs/deepspeed_zero2.yaml recipes/rl_env.py \\
        --config recipes/configs/qwen3_0.6b.yaml

Any field of AleaEnvGRPOConfig (and GRPOConfig / TrainingArguments), ModelConfig or ScriptArguments can be set in
the YAML or overridden on the command line (`--max_steps 50 --train_mode lora`). The run trains, evaluates the
policy on every env (greedy, paired with random and oracle play; `eval_results.json` records the figures and the
episodes), saves the model with its tokenizer and a model card, and pushes it to the Hub when `push_to_hub` is set:
the model is saved before any network call, and an unreachable Hub ends the run with one message saying so.
"""

import sys
from dataclasses import dataclass, field

from transformers import AutoTokenizer
from trl import ModelConfig, TrlParser, get_peft_config

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer
from alea_trl.evaluation import format_table
from alea_trl.loading import load_model, model_init_kwargs_from
from alea_trl.trainer.distributed import end_distributed
from alea_trl.trainer.hub import HubPushError
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


def main(script_args: ScriptArguments, training_args: AleaEnvGRPOConfig, model_args: ModelConfig) -> dict:
    model = load_model(
        model_args.model_name_or_path,
        init_from_config=script_args.init_from_config,
        model_init_kwargs=model_init_kwargs_from(model_args, training_args.model_init_kwargs),
        extras=extra_switches(training_args),
        who="rl_env.py",
    )
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    peft_config = get_peft_config(model_args)
    if peft_config is not None:
        training_args.train_mode = "lora"
    trainer = AleaEnvGRPOTrainer(model, args=training_args, processing_class=tokenizer, peft_config=peft_config)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    table = {}
    if script_args.final_eval_episodes > 0:
        trainer.evaluate(episodes=script_args.final_eval_episodes)
        table = trainer.last_eval_table
        trainer.save_evaluation(env_kwargs=training_args.env_kwargs or {})  # eval_results.json
        if trainer.accelerator.is_main_process:
            print("\n" + format_table(table))
    trainer.save_model(training_args.output_dir)
    trainer.create_model_card()
    if trainer.accelerator.is_main_process:
        print(f"saved to {training_args.output_dir}")
    if training_args.push_to_hub:
        trainer.push_to_hub()
    return table


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, AleaEnvGRPOConfig, ModelConfig))


if __name__ == "__main__":
    try:
        main(*make_parser().parse_args_and_config())
    except HubPushError as err:  # one message: the endpoint, the reason and what was saved where
        sys.exit(f"rl_env.py: {err}")
    end_distributed()  # after main's trainer is gone (see alea_trl/trainer/distributed.py)
