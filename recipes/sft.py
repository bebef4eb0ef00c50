"""Supervised warm start: imitate the oracles on env rollouts, then hand the model to recipes/rl_env.py.

    python recipes/sft.py --config recipes/configs/sft_quickstart.yaml
    accelerate launch recipes/sft.py --model_name_or_path Qwen/Qwen3-0.6B --output_dir runs/sft_v1 ...

Decisions come from rollouts of the envs under a behaviour policy mixing oracle and random actions; their targets
are the oracles' (act: a softmax of the exact expected rewards, or the oracle action; reports: the exact answers).
The dataset is a `datasets.Dataset` (saved with `save_to_disk` when `dataset_dir` is set, pushed with
`dataset_hub_id`); the trained model (an `AleaModel` with its tokenizer and a model card holding a greedy evaluation
of the envs) is what `rl_env.py` takes as `model_name_or_path`.
"""

import os
import sys
from dataclasses import dataclass, field

from datasets import load_from_disk
from transformers import AutoTokenizer
from trl import ModelConfig, TrlParser

from alea_trl import AleaSFTConfig, AleaSFTTrainer, HubPushError, end_distributed
from alea_trl.decision_data import collect_decisions
from alea_trl.envs import BUILTIN_ENVS
from alea_trl.evaluation import format_table
from alea_trl.loading import load_model, model_init_kwargs_from
from alea_trl.trainer import extra_switches


@dataclass
class SFTScriptArguments:
    """How the decision dataset is made, and where it goes."""

    envs: list[str] = field(default_factory=lambda: list(BUILTIN_ENVS), metadata={"help": "Envs to roll out."})
    episodes_per_env: int = field(default=500, metadata={"help": "Rollout episodes per env."})
    oracle_mix: float = field(default=0.5, metadata={"help": "Probability the behaviour policy plays the oracle."})
    act_temperature: float = field(
        default=0.1, metadata={"help": "Temperature of the dense act target, relative to the reward spread."}
    )
    data_seed_offset: int = field(default=0, metadata={"help": "Added to `seed` for the rollouts."})
    dataset_dir: str | None = field(
        default=None, metadata={"help": "Load the dataset from here if it exists, else build and save it here."}
    )
    dataset_hub_id: str | None = field(default=None, metadata={"help": "Push the dataset to this Hub repo."})
    init_from_config: bool = field(
        default=False, metadata={"help": "Build the backbone from model_name_or_path's config with random weights."}
    )
    use_aux_embed: bool = field(default=False, metadata={"help": "New models: zero-initialised role embeddings."})
    use_bigram: bool = field(default=False, metadata={"help": "New models: hashed bigram embedding."})
    use_trigram: bool = field(default=False, metadata={"help": "New models: hashed trigram embedding."})
    final_eval_episodes: int = field(
        default=100, metadata={"help": "Episodes per env of the greedy evaluation after training (0 to skip)."}
    )


def build_dataset(script_args: SFTScriptArguments, seed: int):
    if script_args.dataset_dir and os.path.isdir(script_args.dataset_dir):
        return load_from_disk(script_args.dataset_dir)
    dataset = collect_decisions(
        script_args.envs,
        script_args.episodes_per_env,
        seed=seed + script_args.data_seed_offset,
        oracle_mix=script_args.oracle_mix,
        act_temperature=script_args.act_temperature,
    )
    if script_args.dataset_dir:
        dataset.save_to_disk(script_args.dataset_dir)
    if script_args.dataset_hub_id:
        dataset.push_to_hub(script_args.dataset_hub_id)
    return dataset


def main(script_args: SFTScriptArguments, training_args: AleaSFTConfig, model_args: ModelConfig) -> AleaSFTTrainer:
    model = load_model(
        model_args.model_name_or_path,
        init_from_config=script_args.init_from_config,
        model_init_kwargs=model_init_kwargs_from(model_args),
        extras=extra_switches(script_args),
        who="sft.py",
    )
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    dataset = build_dataset(script_args, training_args.seed)
    trainer = AleaSFTTrainer(model, args=training_args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if script_args.final_eval_episodes > 0:
        table = trainer.evaluate_envs(script_args.envs, episodes=script_args.final_eval_episodes)
        trainer.save_evaluation()  # eval_results.json
        if trainer.accelerator.is_main_process:
            print("\n" + format_table(table))
    trainer.save_model(training_args.output_dir)
    trainer.create_model_card()
    if training_args.push_to_hub:
        trainer.push_to_hub()
    return trainer


def make_parser() -> TrlParser:
    return TrlParser((SFTScriptArguments, AleaSFTConfig, ModelConfig))


if __name__ == "__main__":
    try:
        main(*make_parser().parse_args_and_config())
    except HubPushError as err:  # one message: the endpoint, the reason and what was saved where
        sys.exit(f"sft.py: {err}")
    end_distributed()  # after main's trainer is gone (see alea_trl/trainer/distributed.py)
