"""Supervised warm start: imitate the oracles on env rollouts, then hand the model to recipes/rl_env.py.

    python recipes/sft.py --config recipes/configs/sft_quickstart.yaml
    accelerate launch recipes/sft.py --model_name_or_path Qwen/Qwen3-0.6B --output_dir runs/sft_v1 ...

Decisions come from rollouts of the envs under a behaviour policy mixing oracle and random actions; their targets
are the oracles' (act: a softmax of the exact expected rewards, or the oracle action; reports: the exact answers).
The dataset is a `datasets.Dataset` (saved with `save_to_disk` when `dataset_dir` is set, pushed with
`dataset_hub_id`); the trained model (an `AleaModel` with its tokenizer) is what `rl_env.py` takes as `model_name_or_path`.
"""

import os
from dataclasses import dataclass, field

import torch
from datasets import load_from_disk
from transformers import AutoConfig, AutoTokenizer
from trl import ModelConfig, TrlParser

from alea_trl import AleaModel
from alea_trl.decision_data import collect_decisions
from alea_trl.envs import BUILTIN_ENVS
from alea_trl.trainer.distributed import end_distributed
from alea_trl.trainer.model_setup import extra_switches
from alea_trl.trainer.sft_trainer import AleaSFTConfig, AleaSFTTrainer


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


def build_model(script_args: SFTScriptArguments, model_args: ModelConfig) -> AleaModel:
    path = model_args.model_name_or_path
    dtype = model_args.dtype if model_args.dtype not in (None, "auto") else "float32"
    kwargs = {"dtype": getattr(torch, dtype)}
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    heads = extra_switches(script_args)
    config = AutoConfig.from_pretrained(path, revision=model_args.model_revision)
    if config.model_type == "alea":
        return AleaModel.from_pretrained(path, revision=model_args.model_revision, **kwargs)
    if script_args.init_from_config:
        return AleaModel.from_backbone(config, backbone_kwargs=kwargs, **heads)
    return AleaModel.from_backbone(path, backbone_kwargs={"revision": model_args.model_revision, **kwargs}, **heads)


def main(script_args: SFTScriptArguments, training_args: AleaSFTConfig, model_args: ModelConfig) -> AleaSFTTrainer:
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    dataset = build_dataset(script_args, training_args.seed)
    model = build_model(script_args, model_args)
    trainer = AleaSFTTrainer(model, args=training_args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub()
    return trainer


def make_parser() -> TrlParser:
    return TrlParser((SFTScriptArguments, AleaSFTConfig, ModelConfig))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
    end_distributed()  # after main's trainer is gone (see alea_trl/trainer/distributed.py)
