"""``evaluate()`` of the trainer: greedy episodes of every env instead of a loss over an eval dataset.

Design decisions:
1. There is no eval dataset: each env plays ``eval_episodes`` (or the given counts) greedy episodes from its own seed
   (``args.seed + 1`` unless given), split across processes; the per-env figures of
   :func:`~alea_trl.evaluation.evaluation_sums` are reduced as ``(sum, count)`` pairs, logged with the eval prefix and
   kept as ``last_eval_table`` (with ``last_eval_settings``: the episodes, seed and envs, for the model card).
2. Undefined figures (NaN: an env whose oracle ties random, a zero baseline) are not logged. ``eval_normalized_score``
   is the mean over envs of the defined normalised scores: one figure for ``metric_for_best_model``.
3. Periodic evaluation is Trainer's own (``eval_strategy`` / ``eval_steps`` call ``evaluate()``, then
   ``load_best_model_at_end`` / ``save_strategy="best"`` read ``metric_for_best_model`` from its metrics).
   ``Trainer.__init__`` refuses an ``eval_strategy`` without an eval dataset, so it sees ``"no"`` for its duration;
   ``metric_for_best_model`` must name a figure ``evaluate()`` logs (there is no eval loss), checked up front.
"""

from __future__ import annotations

import contextlib

from transformers.trainer_utils import IntervalStrategy

from ..evaluation import evaluation_sums, table_from_means, table_metrics
from .reference import is_peft_model


# figures ``evaluate()`` logs per env (``eval_<env>/<figure>``); report / skill / baseline figures take a qtype
ENV_FIGURES = ("return", "random", "oracle", "normalized_score", "expected_score", "regret", "skipped")
QTYPE_FIGURES = ("report", "skill", "baseline")


def check_metric_for_best_model(args, env_names) -> None:
    """Raise `ValueError` naming ``metric_for_best_model`` unless it names a figure ``evaluate()`` logs."""
    metric = args.metric_for_best_model
    if metric is None:
        return
    key = metric[len("eval_") :] if metric.startswith("eval_") else metric
    env, _, figure = key.partition("/")
    if key == "normalized_score" or (env in env_names and (figure in ENV_FIGURES or figure.startswith(QTYPE_FIGURES))):
        return
    raise ValueError(
        f"AleaEnvGRPOTrainer: field 'metric_for_best_model': {metric!r} is not a figure evaluate() logs (it plays "
        "episodes, so there is no eval loss; load_best_model_at_end defaults it to 'loss'); use 'normalized_score' "
        f"(the mean over envs) or '<env>/<figure>' with env one of {sorted(env_names)} and figure one of "
        f"{list(ENV_FIGURES)} or report/<qtype>, skill/<qtype>, and set greater_is_better to match"
    )


@contextlib.contextmanager
def periodic_evaluation(args, env_names):
    """For the duration of ``Trainer.__init__``: ``eval_strategy`` reads ``"no"`` (evaluation plays envs, there is no
    eval dataset to require), after ``metric_for_best_model`` was checked."""
    check_metric_for_best_model(args, env_names)
    strategy = args.eval_strategy
    args.eval_strategy = IntervalStrategy.NO
    try:
        yield
    finally:
        args.eval_strategy = strategy


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
        skills (see :func:`~alea_trl.evaluation.evaluation_sums`), and their mean normalised score
        (``<prefix>_normalized_score``); the table is kept as ``last_eval_table``, its episodes and seed as
        ``last_eval_settings``. Called by Trainer every ``eval_steps`` with ``eval_strategy="steps"``.

        Args:
            metric_key_prefix (`str`, defaults to `"eval"`): prefix of the logged keys (``eval_<env>/<figure>``).
            episodes (`int` or `dict[str, int]`, *optional*): episodes per env, one count for all or one per env
                (default ``args.eval_episodes``).
            seed (`int`, *optional*): seed of the evaluation episodes (default ``args.seed + 1``).
        """
        unwrapped = self.accelerator.unwrap_model(self.model)
        was_training = unwrapped.training
        unwrapped.eval()
        episodes = self.args.eval_episodes if episodes is None else episodes
        seed = self.args.seed + 1 if seed is None else seed
        # predict runs the forward of the model itself: under LoRA that is peft's base model (adapters inside it)
        answering = unwrapped.get_base_model() if is_peft_model(unwrapped) else unwrapped
        with self.even_forwards.region({1: answering}):  # sharded: as many forwards on every process
            sums = evaluation_sums(
                answering,
                self._tokenizer,
                self.env_factories,
                episodes=episodes,
                seed=seed,
                max_len=self.args.max_len,
                batch_size=self.args.max_batch,
                shard=(self.accelerator.process_index, self.accelerator.num_processes),
            )
        table = {env: {} for env in self.env_factories} | table_from_means(self.gathered_means(sums))
        self.last_eval_table = table
        self.last_eval_settings = {"episodes": episodes, "seed": seed, "envs": list(self.env_factories)}
        metrics = table_metrics(table, metric_key_prefix)
        self.log(metrics)
        unwrapped.train(was_training)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


__all__ = ["GreedyEvaluation", "check_metric_for_best_model", "periodic_evaluation"]
