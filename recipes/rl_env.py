"""GRPO over environment decision points with AleaEnvGRPOTrainer.

    accelerate launch recipes/rl_env.py --config recipes/configs/quickstart.yaml
    accelerate launch --config_file accelerate_configs/deepspeed_zero2.yaml recipes/rl_env.py \\
        --config recipes/configs/qwen3_0.6b.yaml
    accelerate launch --cpu recipes/rl_env.py --config recipes/configs/smollm2_135m.yaml   # a real pretrained model

Any field of AleaEnvGRPOConfig (and GRPOConfig / TrainingArguments), ModelConfig or ScriptArguments can be set in
the YAML or overridden on the command line (`--max_steps 50 --train_mode lora`). The run trains, evaluates the
policy on every env (greedy, paired with random and oracle play; `eval_results.json` records the figures and the
episodes), saves the model with its tokenizer and a model card, and pushes it to the Hub when `push_to_hub` is set:
the model is saved before any network call, and an unreachable Hub ends the run with one message saying so.
`model_name_or_path` may be a `.gguf` file (converted once into an ordinary checkpoint in the cache), and
`fetch_model` names a model of `python -m alea_trl.models` that is fetched into the cache when absent.
"""

import sys
from dataclasses import dataclass, field

from transformers import AutoTokenizer
from trl import ModelConfig, TrlParser, get_peft_config

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, HubPushError, describe_engine, end_distributed
from alea_trl.evaluation import format_table
from alea_trl.loading import load_model, model_init_kwargs_from
from alea_trl.model_files import resolve_gguf
from alea_trl.models import MODELS, FetchError, fetch
from alea_trl.trainer import extra_switches


@dataclass
class ScriptArguments:
    """Arguments of the recipe that are not training settings."""

    init_from_config: bool = field(
        default=False,
        metadata={"help": "Build the backbone from model_name_or_path's config with random weights (offline runs)."},
    )
    fetch_model: str | None = field(
        default=None,
        metadata={
            "help": "A model of `python -m alea_trl.models` (" + ", ".join(sorted(MODELS)) + "): fetched into the "
            "cache when absent and used as model_name_or_path (leave that unset)."
        },
    )
    final_eval_episodes: int = field(
        default=100, metadata={"help": "Episodes per env of the evaluation after training (0 to skip)."}
    )


def main(script_args: ScriptArguments, training_args: AleaEnvGRPOConfig, model_args: ModelConfig) -> dict:
    if script_args.fetch_model and model_args.model_name_or_path:
        raise ValueError(
            f"rl_env.py: field 'fetch_model': {script_args.fetch_model!r} and model_name_or_path "
            f"{model_args.model_name_or_path!r} both name the model; keep one"
        )
    if not (script_args.fetch_model or model_args.model_name_or_path):
        raise ValueError("rl_env.py: field 'model_name_or_path': no model given (or set fetch_model)")
    # files are written once: the main process fetches or converts first, the others then find the finished folder
    with training_args.main_process_first(desc="model files"):
        if script_args.fetch_model:
            model_args.model_name_or_path = fetch(script_args.fetch_model)
        model_args.model_name_or_path = resolve_gguf(model_args.model_name_or_path)  # a .gguf file: its checkpoint
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
    if trainer.accelerator.is_main_process:
        print(f"trained under {describe_engine(trainer)}")

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
        parsed = make_parser().parse_args_and_config()
    except ValueError as err:  # a refused setting: the config's message names the field and the fix
        sys.exit(f"rl_env.py: {err}")
    try:
        main(*parsed)
    except (HubPushError, FetchError) as err:  # one message: what failed and why (for a push, what was saved where)
        sys.exit(f"rl_env.py: {err}")
    end_distributed()  # after main's trainer is gone (see alea_trl/trainer/distributed.py)
