"""The 0.6B recipe's precision settings (float32 master weights, bfloat16 autocast) move every trained weight; a
half-precision model trained by a plain optimizer gets a warning."""

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
from trl import ModelConfig, TrlParser

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.testing import build_tiny_tokenizer, tiny_backbone_config
from alea_trl.trainer.model_setup import apply_train_mode


ROOT = Path(__file__).parents[2]


def _recipe():
    spec = importlib.util.spec_from_file_location("rl_env", ROOT / "recipes" / "rl_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _warm_start(path) -> AleaModel:
    """A tiny float32 AleaModel checkpoint standing in for the recipe's SFT warm start."""
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = AleaModel.from_backbone(tiny_backbone_config(vocab_size=len(tokenizer)))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def test_qwen_recipe_settings_move_every_trained_weight(tmp_path):
    init = _warm_start(tmp_path / "sft")
    recipe = _recipe()
    parser = TrlParser((recipe.ScriptArguments, AleaEnvGRPOConfig, ModelConfig))
    overrides = ["--model_name_or_path", str(tmp_path / "sft"), "--output_dir", str(tmp_path / "out")]
    overrides += ["--max_steps", "3", "--use_cpu", "true", "--report_to", "none", "--final_eval_episodes", "0"]
    overrides += ["--eps_per_env", "4", "--save_strategy", "no", "--logging_steps", "1"]  # smaller pool: CPU
    script_args, training_args, model_args = parser.parse_args_and_config(
        ["--config", str(ROOT / "recipes" / "configs" / "qwen3_0.6b.yaml"), *overrides]
    )
    # the settings under test come from the recipe's file
    assert model_args.dtype == "float32" and training_args.bf16 and training_args.learning_rate == 5e-6
    assert training_args.train_mode == "tail" and training_args.beta > 0
    recipe.main(script_args, training_args, model_args)

    trained = AleaModel.from_pretrained(tmp_path / "out")
    assert trained.dtype == torch.float32
    apply_train_mode(init, "tail", training_args.tail_k)  # which weights the recipe trains
    trainable = {n for n, p in init.named_parameters() if p.requires_grad}
    groups = {"heads": [], "backbone": []}
    for name, before in init.named_parameters():
        if name not in trainable:
            continue
        changed = (trained.get_parameter(name) != before).float().mean().item()
        groups["heads" if "head" in name else "backbone"].append((name, changed))
    assert groups["heads"] and groups["backbone"]
    assert all(changed > 0 for _, changed in groups["heads"]), groups["heads"]
    # each backbone tensor (decoder layers, norms) moves almost everywhere: a bfloat16 weight would not
    assert all(changed > 0.9 for _, changed in groups["backbone"]), groups["backbone"]


def test_half_precision_parameters_with_a_plain_optimizer_warn(tmp_path):
    tokenizer = build_tiny_tokenizer()
    model = AleaModel.from_backbone(
        tiny_backbone_config(vocab_size=len(tokenizer)), backbone_kwargs={"dtype": torch.bfloat16}
    ).to(torch.bfloat16)
    args = AleaEnvGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        envs=["kelly"],
        max_steps=1,
        eps_per_env=2,
        max_batch=4,
        per_device_train_batch_size=4,
        num_generations=4,
    )
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    with pytest.warns(UserWarning, match="keeps no float32 copy"):
        trainer.create_optimizer()

    fp32 = AleaModel.from_backbone(tiny_backbone_config(vocab_size=len(tokenizer)))
    trainer = AleaEnvGRPOTrainer(fp32, args=args, processing_class=tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trainer.create_optimizer()  # float32 parameters: no warning
