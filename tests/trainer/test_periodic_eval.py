"""Periodic evaluation: eval_strategy / eval_steps play the envs during training, and load_best_model_at_end /
metric_for_best_model work on the figures evaluate() logs."""

import math
import os

import pytest
import torch
from safetensors.torch import load_file

from alea_trl import AleaEnvGRPOTrainer


ENVS = ["kelly", "nim"]


def test_eval_strategy_steps_plays_the_envs_during_training(tiny_model, tokenizer, make_args):
    args = make_args(envs=ENVS, max_steps=4, eval_strategy="steps", eval_steps=2, eval_episodes=2)
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_kelly/return" in h]
    assert [h["step"] for h in evals] == [2, 4]
    for h in evals:
        assert {"eval_nim/return", "eval_kelly/regret", "eval_kelly/skill/noul"} <= set(h)
        defined = [h[k] for k in ("eval_kelly/normalized_score", "eval_nim/normalized_score") if k in h]
        if defined:  # the mean over envs of the defined normalised scores
            assert h["eval_normalized_score"] == pytest.approx(sum(defined) / len(defined))
    # the last periodic evaluation is the model's evaluation on the same episodes: playing them again agrees
    again = trainer.evaluate(episodes=2)
    assert again["eval_kelly/return"] == pytest.approx(evals[-1]["eval_kelly/return"])
    assert trainer.args.eval_strategy == "steps"  # Trainer.__init__ saw "no" only for its duration


def test_load_best_model_at_end_restores_the_best_checkpoint(tiny_model, tokenizer, make_args):
    # a report loss as the metric, higher is "better": any checkpoint can be the best, the test follows the logs
    args = make_args(
        envs=ENVS,
        max_steps=3,
        eval_strategy="steps",
        eval_steps=1,
        eval_episodes=2,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="kelly/report/noul",
        greater_is_better=True,
    )
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
    trainer.train()
    logged = {
        h["step"]: h["eval_kelly/report/noul"] for h in trainer.state.log_history if "eval_kelly/report/noul" in h
    }
    assert sorted(logged) == [1, 2, 3]
    best_step = max(logged, key=logged.get)
    assert trainer.state.best_metric == logged[best_step]
    assert os.path.basename(trainer.state.best_model_checkpoint) == f"checkpoint-{best_step}"
    saved = load_file(os.path.join(trainer.state.best_model_checkpoint, "model.safetensors"))
    model = trainer.accelerator.unwrap_model(trainer.model)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, saved[name], atol=0, rtol=0, msg=name)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"load_best_model_at_end": True}, "'loss'"),  # Trainer's default metric: there is no eval loss
        ({"metric_for_best_model": "kelly/bogus"}, "'kelly/bogus'"),
        ({"metric_for_best_model": "hmm/return"}, "'hmm/return'"),  # an env that is not trained
    ],
)
def test_metric_for_best_model_must_be_a_logged_figure(overrides, needle, tiny_model, tokenizer, make_args):
    args = make_args(envs=ENVS, eval_strategy="steps", save_strategy="steps", **overrides)
    with pytest.raises(ValueError, match="field 'metric_for_best_model'") as error:
        AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
    assert needle in str(error.value) and "normalized_score" in str(error.value)


@pytest.mark.parametrize("metric", ["normalized_score", "eval_nim/return", "kelly/skill/regress"])
def test_metric_for_best_model_accepts_logged_figures(metric, tiny_model, tokenizer, make_args):
    args = make_args(envs=ENVS, eval_strategy="steps", metric_for_best_model=metric)
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
    metrics = trainer.evaluate(episodes=1)
    key = metric if metric.startswith("eval_") else f"eval_{metric}"
    assert key in metrics and math.isfinite(metrics[key])
