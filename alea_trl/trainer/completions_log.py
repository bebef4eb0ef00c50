"""``log_completions``: the sampled actions of training, as TRL's table of completions (parquet files under
``output_dir/completions``, the rich console table, wandb / trackio, the Hub dataset of ``log_completions_hub_repo``).

Design decisions:
1. One entry per action that trains, logged when its row is handed to the loss (rows of a separate rollout when
   their generation batch is made; with ``sample_in_loss_forward``, the rows whose actions train in each loss
   forward), so every action is logged once: ``prompt`` is the env name and the start of the state text,
   ``completion`` the option label of the action, ``reward`` the value its advantage was computed from (dense: its
   expected reward; outcome: its branch return, return-to-go or the episode's return), ``advantage``, and an ``env``
   column. The actions that train are a decision's sampled ones, except under ``dense_update="all_actions"`` (the
   default): a dense decision then trains every legal action by its own advantage and its k samples only choose how
   the episode advances, so its entries are its legal actions with those advantages (a row of n legal actions
   logs n entries, whatever k).
2. ``GRPOTrainer.log`` writes the table from TRL's ``_logs`` deques; they are sized to hold one generation batch's
   actions (``generation_batch_size x num_generations``), so a table shows the latest ones.
3. The entries of all processes are gathered (``gather_object``): every process calls it at the same points.
"""

from __future__ import annotations

from collections import defaultdict, deque

from accelerate.utils import gather_object

from ..questions import ACT_QID


STATE_EXCERPT = 200  # characters of the state text in a logged prompt


def decision_entries(inputs: dict, env_names: list[str], tokenizer) -> list[tuple[str, str, float, float, str]]:
    """``(prompt, completion, reward, advantage, env)`` of every action that trains in loss inputs: each real sample,
    or every legal action of a row trained by all its actions (``all_actions_rows``).

    Args:
        inputs (`dict`): loss inputs (see `alea_trl.trainer.loss_inputs.rows_to_inputs`).
        env_names (`list[str]`): env index -> name.
        tokenizer: decodes the state tokens.
    """
    entries = []
    mask, actions = inputs["sample_mask"].tolist(), inputs["actions"].tolist()
    values, advantages = inputs["values"].tolist(), inputs["advantages"].tolist()
    every_action = inputs["all_actions_rows"].tolist()
    action_values, action_advantages = inputs["action_values"].tolist(), inputs["action_advantages"].tolist()
    for i, (packed, env) in enumerate(zip(inputs["packed"], inputs["env_index"].tolist())):
        if not any(mask[i]):
            continue
        name = env_names[env]
        state = tokenizer.decode(packed.input_ids[: min(packed.n_state_tokens, STATE_EXCERPT)])
        prompt = f"{name}: {state.strip()[:STATE_EXCERPT]}"
        options = next(q for q in packed.questions if q.qid == ACT_QID).options
        if every_action[i]:  # every legal action trains by its own advantage; the samples only advance the episode
            for a, option in enumerate(options):
                entries.append((prompt, str(option), action_values[i][a], action_advantages[i][a], name))
            continue
        for j, real in enumerate(mask[i]):
            if real:
                entries.append((prompt, str(options[actions[i][j]]), values[i][j], advantages[i][j], name))
    return entries


class CompletionsLog:
    """Mixin of the trainer: fills ``GRPOTrainer``'s ``_logs`` with sampled actions (see the module docstring)."""

    def _reset_completion_logs(self) -> None:
        """TRL's ``_logs``, sized to one generation batch of sampled actions."""
        n = self.args.generation_batch_size * max(
            [self.args.num_generations, *self.args.num_generations_per_env.values()]
        )
        self._logs = {
            "images": deque(maxlen=n),
            "prompt": deque(maxlen=n),
            "completion": deque(maxlen=n),
            "rewards": defaultdict(lambda: deque(maxlen=n)),
            "advantages": deque(maxlen=n),
            "extra": defaultdict(lambda: deque(maxlen=n)),
        }

    def _log_completions(self, inputs: dict) -> None:
        """Add the real samples of ``inputs`` (all processes') to the table; a no-op unless ``log_completions``."""
        if not self.log_completions:
            return
        entries = gather_object(decision_entries(inputs, self.rollout.pool.env_names, self._tokenizer))
        for prompt, completion, reward, advantage, env in entries:
            self._logs["prompt"].append(prompt)
            self._logs["completion"].append(completion)
            self._logs["rewards"]["reward"].append(reward)
            self._logs["advantages"].append(advantage)
            self._logs["extra"]["env"].append(env)


__all__ = ["CompletionsLog", "decision_entries"]
