"""Fixtures for trainer tests: a tiny fp32 model and a config builder with test-sized settings."""

import pytest
import torch

from alea_trl import AleaEnvGRPOConfig, AleaModel
from alea_trl.testing import tiny_backbone_config

from .toy_envs import NamedBestEnv, ThreeInARowEnv


TOY_FACTORIES = {"named_best": NamedBestEnv, "three_in_a_row": ThreeInARowEnv}


@pytest.fixture
def tiny_model(tokenizer):
    def _make(seed=0, family="qwen3", **head_kwargs):
        torch.manual_seed(seed)
        config = tiny_backbone_config(family, vocab_size=len(tokenizer), num_layers=2)
        return AleaModel.from_backbone(config, backbone_kwargs={"dtype": torch.float32}, **head_kwargs)

    return _make


@pytest.fixture
def make_args(tmp_path):
    def _make(**overrides):
        kwargs = dict(
            output_dir=str(tmp_path / "run"),
            use_cpu=True,
            bf16=False,  # TRL defaults to bf16, which CPU runs slowly
            report_to="none",
            save_strategy="no",
            gradient_checkpointing=False,  # speed; checkpointing itself is tested in test_modeling
            eps_per_env=4,  # small pools keep the tests fast
            max_batch=8,
            per_device_train_batch_size=4,
            num_generations=4,
            max_len=1024,
            learning_rate=1e-3,  # tiny random backbone: large steps so changes are visible in a few updates
            lr_head=1e-3,
            lr_aux=1e-3,
            lr_scheduler_type="constant",
            logging_steps=1,
            max_steps=3,
            eval_episodes=4,
            train_mode="full",
            disable_tqdm=True,
        )
        kwargs.update(overrides)
        return AleaEnvGRPOConfig(**kwargs)

    return _make
