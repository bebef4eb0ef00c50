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
   ``Trainer.__init__`` refuses an ``eval_strategy`` without an eval dataset, so the trainer passes it a placeholder
   one that ``evaluate()`` never reads; ``metric_for_best_model`` must name a figure ``evaluate()`` logs (there is no
   eval loss), checked up front.
"""

from __future__ import annotations

from ...evaluation import evaluation_sums, table_from_means
from ..forward.reference import is_peft_model
from .metrics import gathered_means


# figures ``evaluate()`` logs per env (``eval_<env>/<figure>``); report / skill / baseline figures take a qtype
ENV_FIGURES = ("return", "random", "oracle", "normalized_score", "expected_score", "regret", "goal_share", "skipped")
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


def play_greedy_episodes(
    model, tokenizer, env_factories: dict, args, accelerator, even_forwards, episodes, seed: int
) -> tuple[dict[str, dict[str, float]], dict]:
    """Greedy episodes of every env played by ``model`` (split across processes, see the module docstring).

    Args:
        model (`AleaModel` or `PeftModel`): the unwrapped policy, in eval mode.
        tokenizer: its tokenizer.
        env_factories (`dict`): env name -> factory.
        args: the trainer's config (``max_len``, ``max_batch``).
        accelerator (`Accelerator`): the process index and count, and the reduction of the figures.
        even_forwards (`EvenForwards`): keeps a sharded model's forwards in step across processes.
        episodes (`int` or `dict[str, int]`): episodes per env.
        seed (`int`): seed of the evaluation episodes.

    Returns:
        `(dict, dict)`: the table (env -> figure -> global mean) and how it was played (episodes, seed, envs).
    """
    # predict runs the forward of the model itself: under LoRA that is peft's base model (adapters inside it)
    answering = model.get_base_model() if is_peft_model(model) else model
    with even_forwards.region({1: answering}):  # sharded: as many forwards on every process
        sums = evaluation_sums(
            answering,
            tokenizer,
            env_factories,
            episodes=episodes,
            seed=seed,
            max_len=args.max_len,
            batch_size=args.max_batch,
            shard=(accelerator.process_index, accelerator.num_processes),
        )
    table = {env: {} for env in env_factories} | table_from_means(gathered_means(accelerator, sums))
    return table, {"episodes": episodes, "seed": seed, "envs": list(env_factories)}


__all__ = ["ENV_FIGURES", "QTYPE_FIGURES", "check_metric_for_best_model", "play_greedy_episodes"]
