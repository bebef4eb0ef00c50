"""Variant (c) ``trl`` of the throughput benchmark: stock ``trl.GRPOTrainer`` generating the action as text."""

from __future__ import annotations

import contextlib
import tempfile

import numpy as np
from datasets import Dataset
from transformers import PrinterCallback

from alea_trl.envs import BUILTIN_ENVS, make_env
from alea_trl.trainer.pool import EpisodePool, np_rng_for_rank

from .models import CPU_RUN, MAX_STEPS, Models
from .timing import Runner, RunnerCallback


def collect_prompts(tokenizer, n: int, seed: int) -> tuple[Dataset, int]:
    """``n`` decisions of the five envs (round-robin, random play) as plain-text prompts with their option rewards."""
    factories = {name: (lambda n_=name: make_env(n_)) for name in BUILTIN_ENVS}
    pool = EpisodePool(factories, 16, np_rng_for_rank(seed, 0))
    pick = np.random.default_rng([seed, 7])
    rows = {"prompt": [], "options": [], "option_rewards": []}
    longest = 0
    while len(rows["prompt"]) < n:
        for ep in pool.schedule(len(BUILTIN_ENVS)):
            d = ep.env.observe()
            act = d.act
            if ep.env.dense:
                rewards = [float(r) for r in ep.env.action_rewards()]
            else:
                best = ep.env.oracle_action()
                rewards = [1.0 if i == best else 0.0 for i in range(d.n_legal)]
            prompt = (
                f"{d.state}\nQuestion: {act.text}\nOptions: {'; '.join(act.options)}\n"
                "Reply with exactly one option, written as above.\nAnswer:"
            )
            rows["prompt"].append(prompt)
            rows["options"].append(list(act.options))
            rows["option_rewards"].append(rewards)
            longest = max(
                [longest] + [len(tokenizer(" " + o, add_special_tokens=False)["input_ids"]) for o in act.options]
            )
            _, done = ep.env.step(int(pick.integers(d.n_legal)))
            if done:
                pool.finish(ep)
    return Dataset.from_dict({key: v[:n] for key, v in rows.items()}), longest + 1


def option_reward(prompts, completions, options, option_rewards, **kwargs) -> list[float]:
    """The exact expected reward of the option the completion names; the lowest reward when it names none."""
    out = []
    for text, opts, rewards in zip(completions, options, option_rewards):
        text = text.strip()
        out.append(float(rewards[opts.index(text)]) if text in opts else float(min(rewards)))
    return out


@contextlib.contextmanager
def trl_compact_lm_head(enabled: bool):
    """TRL 1.16's fused LM head scores only the completion positions on Triton devices, but every position of the
    prompt + completion through the whole vocabulary elsewhere (CPU). With ``enabled``, the CPU run scores only the
    completion positions too, as on GPU (the same torch tile code, just the compact token selection)."""
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    if enabled:
        trl_utils._use_triton = lambda device: True
    try:
        yield
    finally:
        trl_utils._use_triton = original


def trl_body(models: Models, tokenizer, k: int, opts, dataset: Dataset, max_completion_length: int):
    from trl import GRPOConfig, GRPOTrainer

    def body(runner: Runner) -> None:
        with tempfile.TemporaryDirectory() as out_dir:
            args = GRPOConfig(
                output_dir=out_dir,
                per_device_train_batch_size=opts.decisions * k,
                num_generations=k,
                max_completion_length=max_completion_length,
                beta=0.0,
                temperature=1.0,
                **CPU_RUN,
                max_steps=MAX_STEPS,
                seed=opts.seed,
            )
            model = models.fresh_lm()
            if opts.train_mode == "tail":  # the same trainable set as (a) and (b): the (tied) embedding is frozen
                model.model.embed_tokens.weight.requires_grad_(False)
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=option_reward,
                args=args,
                train_dataset=dataset,
                processing_class=tokenizer,
                callbacks=[RunnerCallback(runner)],
            )
            trainer.remove_callback(PrinterCallback)
            probe = runner.probe
            probe.attach_backbone(model.model)
            probe.wrap(trainer.accelerator, "backward", "backward")
            probe.wrap(trainer, "_clip_grad_norm", "clip")
            generate = trainer._generate_and_score_completions

            def timed_generate(batch):
                with probe.time("generation_total"):
                    inputs = generate(batch)
                if runner.measuring:
                    prompt = float(inputs["prompt_mask"].sum()) / k  # every prompt is repeated k times
                    completion = float(inputs["completion_mask"].sum())
                    n = len(batch) / k
                    runner.tokens.append((prompt + completion) / n)
                    runner.extra["processed_tokens_per_decision"].append((k * prompt + completion) / n)
                    runner.extra["mean_completion_tokens"].append(completion / len(batch))
                    runner.extra["max_completion_length"].append(max_completion_length)
                    runner.extra["loss_padding_fraction"].append(
                        1.0
                        - float(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
                        / (inputs["prompt_mask"].numel() + inputs["completion_mask"].numel())
                    )
                return inputs

            trainer._generate_and_score_completions = timed_generate
            with trl_compact_lm_head(not opts.trl_cpu_full_lm_head):
                trainer.train()

    return body
