"""``Rollout.advance``: the wave's actions are drawn from the act head's distribution, their log-probs and group
advantages are those of each decision, and both accepted forms of the logits give the same rows."""

import copy

import numpy as np
import torch

from alea_trl.envs import make_env
from alea_trl.trainer.rollout import Rollout
from alea_trl.trainer.rollout.advantages import group_advantages
from alea_trl.trainer.rollout.pool import EpisodePool


def _rollout(tokenizer, make_args, **overrides):
    args = make_args(**({"beta": 0.0} | overrides))  # driven by hand: no reference policy, no KL
    factories = {"kelly": lambda: make_env("kelly"), "nim": lambda: make_env("nim")}
    return Rollout(EpisodePool(factories, eps_per_env=3, rng=np.random.default_rng(0)), tokenizer, args, seed=0)


def _act_logits(wave, seed=0):
    """Random act logits of the right width per decision (kelly: its stakes; nim: its legal moves)."""
    g = torch.Generator().manual_seed(seed)
    widths = [ep.env.observe().n_legal for ep in wave.episodes]
    return [torch.randn(n, generator=g) * 2 for n in widths]


def test_list_and_padded_logits_give_the_same_rows(tokenizer, make_args):
    rollout = _rollout(tokenizer, make_args)
    twin = copy.deepcopy(rollout)
    wave = rollout.observe_wave(6)
    logits = _act_logits(wave)
    ref = [x * 0.5 for x in logits]
    rows = rollout.advance(wave, logits, ref)
    padded = torch.nn.utils.rnn.pad_sequence(logits, batch_first=True, padding_value=float("-inf"))
    ref_padded = torch.nn.utils.rnn.pad_sequence(ref, batch_first=True, padding_value=float("-inf"))
    twin_wave = twin.observe_wave(6)
    twin_rows = twin.advance(twin_wave, padded, ref_padded)
    for a, b, x, r in zip(rows, twin_rows, logits, ref):
        assert a.actions == b.actions and a.old_logps == b.old_logps and a.advantages == b.advantages
        torch.testing.assert_close(a.ref_logps, torch.log_softmax(r, -1))
        torch.testing.assert_close(b.ref_logps, torch.log_softmax(r, -1))
        # the stored behaviour log-probs are those of the sampled actions under the act head
        want = torch.log_softmax(x, -1)[a.actions]
        torch.testing.assert_close(torch.tensor(a.old_logps), want)


def test_actions_follow_the_act_head_and_dense_advantages_are_per_decision(tokenizer, make_args):
    rollout = _rollout(tokenizer, make_args, num_generations=4000, temperature=0.7)
    wave = rollout.observe_wave(6)
    logits = _act_logits(wave, seed=3)
    rows = rollout.advance(wave, logits, None)
    for ep, row, x, r in zip(wave.episodes, rows, logits, wave.rewards):
        if r is None:  # outcome decision: one action, kept with its episode until the return is known
            assert len(row.actions) == 1 and row in ep.pending
            continue
        p = torch.softmax(x / 0.7, -1)
        freq = torch.bincount(torch.tensor(row.actions), minlength=len(p)).float() / len(row.actions)
        assert (freq - p).abs().max() < 0.04  # 4000 draws: standard error <= 0.008
        expected = group_advantages(torch.tensor(r, dtype=torch.float32)[row.actions], "group")
        torch.testing.assert_close(torch.tensor(row.advantages), expected)


def test_batch_scaled_advantages_use_each_envs_own_std(tokenizer, make_args):
    """``scale_rewards="batch"`` on a kelly + newsvendor wave: a row's advantages are scaled by the std of its own
    env's sampled rewards (log growth and money differ by orders of magnitude)."""
    args = make_args(scale_rewards="batch", beta=0.0)  # driven by hand: no reference policy, no KL
    factories = {"kelly": lambda: make_env("kelly"), "newsvendor": lambda: make_env("newsvendor")}
    rollout = Rollout(EpisodePool(factories, eps_per_env=3, rng=np.random.default_rng(0)), tokenizer, args, seed=0)
    wave = rollout.observe_wave(6)
    rows = rollout.advance(wave, _act_logits(wave, seed=5), None)
    sampled = {"kelly": [], "newsvendor": []}
    for ep, row, r in zip(wave.episodes, rows, wave.rewards):
        sampled[ep.env_name].append(torch.tensor(r, dtype=torch.float32)[row.actions])
    std = {name: float(torch.stack(s).std()) for name, s in sampled.items()}
    assert std["newsvendor"] > 10 * std["kelly"]
    for ep, row, r in zip(wave.episodes, rows, wave.rewards):
        expected = group_advantages(torch.tensor(r, dtype=torch.float32)[row.actions], "batch", std[ep.env_name])
        torch.testing.assert_close(torch.tensor(row.advantages), expected)
