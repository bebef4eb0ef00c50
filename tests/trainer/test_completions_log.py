"""``log_completions`` shows what trains: under every ``dense_update`` but ``"sampled"`` (the default
``"all_actions_ascent"`` included) a dense decision's legal actions with the steps or advantages they train by, not
its k samples' group advantages (which train nothing there)."""

import numpy as np
import pytest
import torch

from alea_trl.trainer.outputs.metrics import decision_entries
from alea_trl.trainer.rollout import Rollout
from alea_trl.trainer.rollout.pool import EpisodePool
from alea_trl.trainer.rollout.rows import rows_to_inputs

from .toy_envs import NamedBestEnv


def _one_dense_row(tokenizer, make_args, **overrides):
    """One NamedBestEnv decision whose policy puts most mass on the first option: its row and the options."""
    args = make_args(
        envs=["named_best"], eps_per_env=1, num_generations=4, **({"beta": 0.0} | overrides)
    )  # driven by hand: no reference policy, no KL
    rollout = Rollout(EpisodePool({"named_best": NamedBestEnv}, 1, np.random.default_rng(1)), tokenizer, args, seed=3)
    wave = rollout.observe_wave(1)
    env = wave.episodes[0].env
    options, best = list(env.options), env.best
    assert best != 0  # the seed makes the named colour an improbable option
    row = rollout.advance(wave, torch.tensor([[2.0, 0.0, 0.0, 0.0]]))[0]
    return row, options, best


def test_all_actions_entries_are_every_legal_action_with_the_advantage_it_trains_by(tokenizer, make_args):
    row, options, best = _one_dense_row(tokenizer, make_args)
    entries = decision_entries(rows_to_inputs([row], 4), ["named_best"], tokenizer)
    assert [e[1] for e in entries] == options  # every legal action once, sampled or not
    np.testing.assert_allclose([e[3] for e in entries], row.action_advantages, rtol=1e-6)
    assert [e[2] for e in entries] == [float(a == best) for a in range(4)]  # each action's expected reward
    logged = dict(zip([e[1] for e in entries], [e[3] for e in entries]))
    assert logged[options[best]] > 0 and all(logged[o] < 0 for i, o in enumerate(options) if i != best)


def test_sampled_update_entries_are_the_k_samples_with_their_group_advantages(tokenizer, make_args):
    row, options, _ = _one_dense_row(tokenizer, make_args, dense_update="sampled")
    entries = decision_entries(rows_to_inputs([row], 4), ["named_best"], tokenizer)
    assert [e[1] for e in entries] == [options[a] for a in row.actions]
    assert [e[3] for e in entries] == pytest.approx(row.advantages)
