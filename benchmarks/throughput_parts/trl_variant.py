"""Variants (c) ``trl`` (TRL set up as a TRL user would for this task) and (d) ``trl_stock`` (the action spelt as
text) of the throughput benchmark: ``trl.GRPOTrainer`` generating the action.

(c) asks for the letter of an option: one completion token, and each micro-batch is one group (``k`` completions of
one prompt, generated for that micro-batch alone), so no prompt is padded. (d) asks for the option's text (up to 7
tokens plus EOS, which random weights never sample) and generates and trains all of a step's prompts as one
micro-batch, padded to the longest prompt of the five envs.
"""

from __future__ import annotations

import contextlib
import string
import tempfile

import numpy as np
import torch
from datasets import Dataset
from transformers import PrinterCallback

from alea_trl.envs import BUILTIN_ENVS, make_env
from alea_trl.trainer.rollout import EpisodePool, np_rng_for_rank

from .models import CPU_RUN, MAX_STEPS, Models
from .timing import Runner, RunnerCallback


LETTERS = string.ascii_uppercase


def lettered_prompt(state: str, question: str, options) -> str:
    """The fair set-up's prompt: options listed under letters, the answer one letter."""
    listed = "\n".join(f"{LETTERS[i]}) {o}" for i, o in enumerate(options))
    return f"{state}\nQuestion: {question}\nOptions:\n{listed}\nReply with the letter of one option.\nAnswer:"


def text_prompt(state: str, question: str, options) -> str:
    """The stock set-up's prompt: the answer is an option's text."""
    return (
        f"{state}\nQuestion: {question}\nOptions: {'; '.join(options)}\n"
        "Reply with exactly one option, written as above.\nAnswer:"
    )


def collect_prompts(tokenizer, n: int, seed: int) -> tuple[dict[str, Dataset], int]:
    """``n`` decisions of the five envs (round-robin, random play) as prompts with their option rewards, in both
    renderings (``"letter"``, ``"text"``), and the stock set-up's ``max_completion_length`` (the longest
    ``" " + option`` + 1 for EOS)."""
    factories = {name: (lambda n_=name: make_env(n_)) for name in BUILTIN_ENVS}
    pool = EpisodePool(factories, 16, np_rng_for_rank(seed, 0))
    pick = np.random.default_rng([seed, 7])
    rows = {"letter": [], "text": [], "options": [], "option_rewards": []}
    longest = 0
    while len(rows["text"]) < n:
        for ep in pool.schedule(len(BUILTIN_ENVS)):
            d = ep.env.observe()
            act = d.act
            if len(act.options) > len(LETTERS):
                raise ValueError(f"env {ep.env_name!r}: question 'act': {len(act.options)} options, more than letters")
            if ep.env.dense:
                rewards = [float(r) for r in ep.env.action_rewards()]
            else:  # outcome envs have no exact expected reward: naming the oracle's action scores 1
                best = ep.env.oracle_action()
                rewards = [1.0 if i == best else 0.0 for i in range(d.n_legal)]
            rows["letter"].append(lettered_prompt(d.state, act.text, act.options))
            rows["text"].append(text_prompt(d.state, act.text, act.options))
            rows["options"].append(list(act.options))
            rows["option_rewards"].append(rewards)
            longest = max(
                [longest] + [len(tokenizer(" " + o, add_special_tokens=False)["input_ids"]) for o in act.options]
            )
            _, done = ep.env.step(int(pick.integers(d.n_legal)))
            if done:
                pool.finish(ep)
    base = {key: rows[key][:n] for key in ("options", "option_rewards")}
    datasets = {form: Dataset.from_dict({"prompt": rows[form][:n], **base}) for form in ("letter", "text")}
    return datasets, longest + 1


def letter_reward(prompts, completions, options, option_rewards, **kwargs) -> list[float]:
    """The exact expected reward of the option whose letter the completion is; the lowest reward otherwise."""
    out = []
    for text, opts, rewards in zip(completions, options, option_rewards):
        i = LETTERS.find(text.strip()) if len(text.strip()) == 1 else -1
        out.append(float(rewards[i]) if 0 <= i < len(opts) else float(min(rewards)))
    return out


def option_reward(prompts, completions, options, option_rewards, **kwargs) -> list[float]:
    """The exact expected reward of the option the completion names; the lowest reward when it names none."""
    out = []
    for text, opts, rewards in zip(completions, options, option_rewards):
        text = text.strip()
        out.append(float(rewards[opts.index(text)]) if text in opts else float(min(rewards)))
    return out


_compact_users = 0
_use_triton_original = None


@contextlib.contextmanager
def trl_compact_lm_head(enabled: bool):
    """TRL 1.16's fused LM head scores only the completion positions on Triton devices, but every position of the
    prompt + completion through the whole vocabulary elsewhere (CPU). With ``enabled``, the CPU run scores only the
    completion positions too, as on GPU (the same torch tile code, just the compact token selection).

    The switch is process-wide and reference-counted: it is set while at least one runner is inside this context, so
    a runner that finishes first does not switch it off under another one still training (the runners interleave in
    greenlets of one thread)."""
    global _compact_users, _use_triton_original
    if not enabled:
        yield
        return
    import trl.trainer.utils as trl_utils

    if _compact_users == 0:
        _use_triton_original = trl_utils._use_triton
        trl_utils._use_triton = lambda device: True
    _compact_users += 1
    try:
        yield
    finally:
        _compact_users -= 1
        if _compact_users == 0:
            trl_utils._use_triton = _use_triton_original


def record_generation(runner: Runner, inputs: dict, k: int, opts, compact: bool) -> None:
    """Count one generation batch's decisions and the work TRL does on it: the no-grad generation (the prompt
    prefill, then one token per sequence for each further completion position) and the loss forward with autograd
    over prompt + completion, scoring the completion positions (every position without ``compact``)."""
    prompt_len = inputs["prompt_mask"].sum(1).tolist()  # (B,) real prompt tokens
    completion = inputs["completion_mask"]
    comp_len = completion.sum(1).tolist()  # (B,) completion tokens up to and including EOS
    generated = completion.shape[1]  # decode steps the batch ran
    runner.count(len(prompt_len) // k)
    work = runner.work
    work.forward(prompt_len, grad=False)
    # decode step j feeds completion token j - 1 (position p + j - 1): one token attending p + j keys
    decode = [p + j for p in prompt_len for j in range(1, generated)]
    work.forward([1] * len(decode), grad=False, ctx=decode)
    total = [p + c for p, c in zip(prompt_len, comp_len)]
    work.forward(total, grad=True)
    scored = sum(comp_len) if compact else inputs["prompt_mask"].numel() + completion.numel() - len(total)
    work.lm_head(scored, grad=True)
    if opts.beta != 0.0:  # the reference model's forward over the same sequences
        work.forward(total, grad=False)
        work.lm_head(scored, grad=False)
    runner.extra["mean_completion_tokens"].append(sum(comp_len) / len(comp_len))
    runner.extra["max_completion_tokens"].append(max(comp_len))
    runner.extra["min_completion_tokens"].append(min(comp_len))


def trl_body(
    models: Models, tokenizer, k: int, opts, datasets: dict[str, Dataset], stock_completion: int, stock: bool
):
    """(c) with ``stock=False``, (d) with ``stock=True``."""
    from trl import GRPOConfig, GRPOTrainer

    if stock:  # all prompts of a step generated and trained as one micro-batch, the option's text as the answer
        batches = dict(per_device_train_batch_size=opts.decisions * k, max_completion_length=stock_completion)
        dataset, reward = datasets["text"], option_reward
    else:  # one group per micro-batch, generated for it alone; one letter as the answer
        batches = dict(
            per_device_train_batch_size=k,
            gradient_accumulation_steps=opts.decisions,
            steps_per_generation=1,
            max_completion_length=1,
        )
        dataset, reward = datasets["letter"], letter_reward
    trainable = models.trainable_backbone(opts.train_mode, opts.tail_k)
    compact = not opts.trl_cpu_full_lm_head

    def body(runner: Runner) -> None:
        with tempfile.TemporaryDirectory() as out_dir:
            model = models.fresh_lm(trainable)  # trains what (a) and (b) train
            if opts.beta != 0.0:  # TRL builds its reference from the model's path: give it one
                model.save_pretrained(f"{out_dir}/model")
                model.config._name_or_path = f"{out_dir}/model"
            args = GRPOConfig(
                output_dir=out_dir,
                num_generations=k,
                beta=opts.beta,
                temperature=1.0,
                **batches,
                **CPU_RUN,
                max_steps=MAX_STEPS,
                seed=opts.seed,
            )
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=reward,
                args=args,
                train_dataset=dataset,
                processing_class=tokenizer,
                callbacks=[RunnerCallback(runner)],
            )
            trainer.remove_callback(PrinterCallback)
            probe = runner.probe
            probe.attach_backbone(model.model)
            if trainer.ref_model is not None:
                probe.attach_backbone(trainer.ref_model.model)
            probe.wrap(trainer.accelerator, "backward", "backward")
            probe.wrap(trainer, "_clip_grad_norm", "clip")

            def lm_head_positions(module, args):  # generation calls the LM head module; the fused loss path does not
                if runner.measuring and not torch.is_grad_enabled():
                    runner.work.lm_head(args[0].shape[0] * args[0].shape[1], grad=False)

            model.lm_head.register_forward_pre_hook(lm_head_positions)
            generate = trainer._generate_and_score_completions

            def timed_generate(batch):
                with probe.time("generation_total"):
                    inputs = generate(batch)
                if runner.measuring:
                    record_generation(runner, inputs, k, opts, compact)
                return inputs

            trainer._generate_and_score_completions = timed_generate
            with trl_compact_lm_head(compact):
                trainer.train()

    return body
