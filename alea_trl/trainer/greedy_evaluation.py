"""``evaluate()`` of the trainer: greedy episodes of every env instead of a loss over an eval dataset.

Design decisions:
1. There is no eval dataset: each env plays ``eval_episodes`` (or the given counts) greedy episodes from its own seed
   (``args.seed + 1`` unless given), split across processes; the per-env figures of
   :func:`~alea_trl.evaluation.evaluation_sums` are reduced as ``(sum, count)`` pairs, logged with the eval prefix and
   kept as ``last_eval_table`` (appended to the model card).
2. Undefined figures (NaN: an env whose oracle ties random, a zero baseline) are not logged.
"""

from __future__ import annotations

from ..evaluation import evaluation_sums, table_from_means


class GreedyEvaluation:
    """Mixin of the trainer: ``evaluate()`` plays greedy episodes (see the module docstring)."""

    def evaluate(
        self,
        eval_dataset=None,
        ignore_keys=None,
        metric_key_prefix: str = "eval",
        *,
        episodes: int | dict[str, int] | None = None,
        seed: int | None = None,
    ) -> dict[str, float]:
        """Play greedy episodes of every env (split across processes) and log per env the return, the oracle and random
        returns, the normalised score (and dense envs' expected score and regret) and per-qtype report losses and
        skills (see :func:`~alea_trl.evaluation.evaluation_sums`); the table is kept as ``last_eval_table``.

        Args:
            metric_key_prefix (`str`, defaults to `"eval"`): prefix of the logged keys (``eval_<env>/<figure>``).
            episodes (`int` or `dict[str, int]`, *optional*): episodes per env, one count for all or one per env
                (default ``args.eval_episodes``).
            seed (`int`, *optional*): seed of the evaluation episodes (default ``args.seed + 1``).
        """
        unwrapped = self.accelerator.unwrap_model(self.model)
        was_training = unwrapped.training
        unwrapped.eval()
        with self.even_forwards.region({1: unwrapped}):  # sharded: as many forwards on every process
            sums = evaluation_sums(
                unwrapped,
                self._tokenizer,
                self.env_factories,
                episodes=self.args.eval_episodes if episodes is None else episodes,
                seed=self.args.seed + 1 if seed is None else seed,
                max_len=self.args.max_len,
                batch_size=self.args.max_batch,
                shard=(self.accelerator.process_index, self.accelerator.num_processes),
            )
        table = {env: {} for env in self.env_factories} | table_from_means(self.gathered_means(sums))
        self.last_eval_table = table
        metrics = {  # undefined figures (NaN: an env whose oracle ties random, a zero baseline) are not logged
            f"{metric_key_prefix}_{env}/{k}": v for env, row in table.items() for k, v in row.items() if v == v
        }
        self.log(metrics)
        unwrapped.train(was_training)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


__all__ = ["GreedyEvaluation"]
