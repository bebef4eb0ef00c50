"""AleaEnvGRPOConfig: GRPOConfig plus the environment, head and training-mode settings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from .config_checks import (
    check_generation_pacing,
    check_inherited_fields,
    check_process_group_backend,
    check_resolved_fields,
    fold_trust_remote_code,
)
from .loss.dense import STEP_TARGET_UPDATES


TRAIN_MODES = ("heads", "tail", "full", "lora")
DENSE_ADVANCE = ("best_of_k", "sample")
DENSE_UPDATES = ("sampled", "all_actions", *STEP_TARGET_UPDATES)
ENV_ERROR_MODES = ("raise", "skip")
OUTCOME_ADVANTAGES = ("rtg", "branch", "episode")


def _accelerator_available() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


class _WholeGroups(int):
    """Stand-in for `num_generations` during GRPOConfig's checks: every batch size counts as whole groups."""

    def __rmod__(self, other):
        return 0


@dataclass
class AleaEnvGRPOConfig(GRPOConfig):
    r"""Configuration of [`AleaEnvGRPOTrainer`]: everything in [`~trl.GRPOConfig`], plus the fields below.

    Every GRPOConfig field either acts on decision training or raises a `ValueError` naming it (the status of each
    field is in docs/config_fields.md). Where a meaning exists it is TRL's, read over decisions: `num_generations` is
    k (actions sampled per dense decision), `beta` weighs the exact KL to the reference policy over the legal options,
    `temperature` / `top_k` / `top_p` / `min_p` shape the act head's sampling distribution, `epsilon` / `epsilon_high`
    / `delta` / `loss_type` / `num_iterations` / `scale_rewards` act as in TRL with one sampled action in the place of
    one completion (`scale_rewards="batch"` takes the std over the rewards of one env at a time: envs report rewards
    in their own units). `per_device_train_batch_size` counts *decisions* per loss forward. `bf16` defaults to TRL's
    `True` when a GPU is available and to `False` on a CPU-only machine. Text-generation options (vLLM, tools,
    continuous batching, `max_completion_length`, `generation_kwargs`, ...) have no meaning here and raise unless left
    at their defaults.

    > Environments

    Parameters:
        envs (`list[str]`, *optional*, defaults to `["hmm", "kelly", "newsvendor", "bandit", "nim"]`):
            Registered env names (see `alea_trl.envs.register_env`). The trainer's `env_factories` argument adds
            user factories under new names.
        env_kwargs (`dict[str, dict]`, *optional*):
            Constructor keyword arguments per env name.
        eps_per_env (`int`, *optional*, defaults to `16`):
            Live episodes per env on each process.
        sample_in_loss_forward (`bool`, *optional*, defaults to `True`):
            With `num_iterations == 1`, every micro-batch's loss forward also answers its fresh decisions: actions are
            sampled from its detached act logits and the envs stepped, so each decision costs one forward (no separate
            rollout forward). An outcome decision then trains its KL and reports when made and its action when its
            episode ends (replayed in a later micro-batch). With `num_iterations > 1`, or `False`, generation is a
            separate no-grad forward per wave of `max_batch` decisions.
        pack_rows (`bool`, *optional*, defaults to `True`):
            Let several decisions share one row of a forward (up to the longest decision in it; they cannot attend
            to each other), so short decisions do not pay for padding.
        prefetch_observations (`bool`, *optional*, defaults to `True`):
            After a wave's envs are stepped, observe, validate and pack their next decisions in a background thread
            (pure Python and the tokenizer, no torch) while the backward pass runs; a later wave uses them when the
            env has not moved since. Only built-in-style envs (`AleaEnv` subclasses, whose `observe()` is cached
            until `step`) are prefetched; errors are left for the main thread to raise as usual.
        max_batch (`int`, *optional*, defaults to `24`):
            Most decisions packed into one separate rollout forward.
        max_batch_tokens (`int` or `None`, *optional*, defaults to `None`):
            Padded tokens (longest x rows) of one forward. A batch of decisions is sorted by length and split into
            forwards within this budget, so decisions of very different lengths do not pad each other (the loss
            outputs are merged back, so the loss is unchanged); `None`: one forward per batch.
        max_len (`int`, *optional*, defaults to `2048`):
            Most tokens of one packed decision. Longer decisions reset their episode and are counted in the
            `skipped_decisions` metric; nothing is truncated.
        dense_advance (`str`, *optional*, defaults to `"best_of_k"`):
            How a dense episode advances: by the best of its k sampled actions (`"best_of_k"`: it visits better states)
            or by the first sample (`"sample"`, on-policy). With `"best_of_k"` the episode visits the states the best
            of k reaches, and every decision trains on those states; `env/<name>/return` then logs the policy's
            expected return at them and `env/<name>/return_best_of_k` the realised return (an env whose
            `action_rewards` are returns-to-go, `action_rewards_to_go` as the Gymnasium adapter's Q*, logs its realised
            return as both).
        dense_update (`str`, *optional*, defaults to `"all_actions_ascent"`):
            What trains a dense decision's act (see `alea_trl.trainer.loss.dense`). `"all_actions_ascent"`: every
            legal action trains toward a log-probability step computed when the decision is made, on GRPO's own
            objective over the legal actions `J = E[Q] / scale - beta KL(pi || pi_ref)`: the all-actions step below on
            the regularised advantages (the KL folded in, so these decisions take no separate KL term), lifted to a
            cosine of at least 0.1 with the gradient of `J` where it is below (every step ascends `J`), its size capped
            at `sqrt(2)` times the largest advantage whatever the number of legal actions (a two-action decision's
            all-actions step is never longer, so it is kept whole), and fitted by a regression loss bounded by
            `max A^2` (no ratio clip: with `num_iterations > 1` later passes approach the same target and stop
            there). Its fixed point is `pi*(a) ~ pi_ref(a) exp(Q(a) / (scale beta))` (greedy at `beta = 0`),
            and an improbable action better than the policy's average keeps a step of about its advantage.
            `"all_actions"`: every legal action with its exact advantage `(Q(a) - V) / scale`; an action better than
            the policy's expected reward `V` gets a log-probability step that does not shrink with its probability, a
            worse one the exact expected gradient, with the ratio clip of `epsilon` / `epsilon_high` per legal action
            and `beta` as a separate KL term. It settles greedier than `pi*` at `beta > 0`, its step grows with the
            number of legal actions and on about one random decision in ten it does not ascend `J`.
            `"mirror"`: every legal action toward the mirror-descent target of `J` (the natural-gradient step
            `A / sqrt(n)` over the `n` legal actions, fitted as `"all_actions_ascent"` is), with the same fixed point.
            `"sampled"`: the k sampled actions with their group advantages (GRPO's update); its step shrinks with the
            best action's probability, so a state whose best action became improbable may never sample it again.
            `loss_type` (other than grpo / bnpo), `top_entropy_quantile` and `off_policy_mask_threshold` act on
            sampled actions and are refused under every value but `"sampled"`, the default included: set `"sampled"`
            to use them. Outcome decisions train by their samples whatever this field says.
        outcome_advantage (`str`, *optional*, defaults to `"branch"`):
            How an outcome decision's sampled action is valued: `"rtg"`, its reward-to-go (this and every later
            reward of the episode) against that env's recent rewards-to-go at the same step of an episode; `"branch"`,
            Monte Carlo branching: each of its k samples is tried in a deep copy of the env and the current policy
            plays the copy to the end, so the decision is a GRPO group trained at once (costs about k x the decisions
            left in the episode, in forwards without autograd; capped by `branch_limit`; envs that cannot be copied
            fall back to `"rtg"`); `"episode"`, the episode's return against the env's recent returns, for every
            decision of the episode.
        branch_limit (`int`, *optional*, defaults to `8`):
            With `outcome_advantage="branch"`, the most outcome decisions branched per batch of decisions; the others
            are valued by reward-to-go.
        branch_max_rounds (`int`, *optional*, defaults to `1000`):
            With `outcome_advantage="branch"`, the most continuation rounds (one no-grad forward each, answering every
            live copy) that valuing one batch of decisions may run. A decision whose copies are still playing at the
            cap is valued by reward-to-go and counted in the metric `branch/capped` (an env with no horizon under a
            policy that never ends it would otherwise keep the step waiting forever). The default is above the
            horizon of every built-in env.
        branch_explore (`float`, *optional*, defaults to `0.0`):
            With `outcome_advantage="branch"`, the share of uniform play in the continuations: each continuation
            action is drawn from `(1 - branch_explore)` x the policy + `branch_explore` x uniform over the legal
            actions. Branch values are then those of that mixed policy. It keeps a sparse, all-or-nothing env's
            branches informative once the policy is sure of a wrong action (every branch would be worth 0 otherwise).
        num_generations_per_env (`dict[str, int]`, *optional*):
            k by env name, for the named envs; the others sample `num_generations`. An env whose groups need more
            samples (an outcome env whose best move k = 8 draws often miss) gets them without widening every
            env's; with branching its cost grows with its k. A JSON string is accepted.
        outcome_loss_weight (`float`, *optional*, defaults to `1.0`):
            Weight of an outcome env's decision in the policy loss, a dense env's weighing 1. Every decision is one
            term (the mean over its samples, or its term over every legal action) divided by the decisions of the
            micro-batch, so at 1 a dense and an outcome decision of equal advantages pull equally, whatever their k
            and whatever shares their micro-batch; the kinds' shares of a step follow their numbers of decisions times
            weights.
        outcome_baseline_window (`int`, *optional*, defaults to `64`):
            Outcome envs: returns (and returns-to-go at each step) are normalised per env by the mean (and, with
            `scale_rewards`, the std) of this many most recent ones of that env.
        on_env_error (`str`, *optional*, defaults to `"raise"`):
            What a malformed decision, target or reward does: `"raise"` a `ValueError` naming the env, the question
            and the field, or `"skip"`: reset that episode and count it in `skipped_decisions`. The same holds in the
            env copies of `outcome_advantage="branch"`: `"raise"` raises, `"skip"` values that decision by
            reward-to-go and counts it in `branch/failed/<cause>`.
        eval_episodes (`int`, *optional*, defaults to `32`):
            Episodes per env played greedily by `evaluate()`.

    > Model

    Parameters:
        report_w (`float`, *optional*, defaults to `1.0`):
            Weight of the proper-scoring report loss.
        lr_head (`float`, *optional*, defaults to `2e-5`):
            Learning rate of the four heads (`learning_rate` is the backbone's).
        lr_aux (`float`, *optional*, defaults to `1e-4`):
            Learning rate of the input-side extras (role and n-gram embeddings). Each of the three groups takes
            `weight_decay` on the parameters `Trainer.get_decay_parameter_names` picks (not biases or norm weights).
        train_mode (`str`, *optional*, defaults to `"tail"`):
            What trains: `"heads"`, `"tail"` (the last `tail_k` decoder layers, the final norm and the heads),
            `"full"`, or `"lora"` (LoRA on the last `tail_k` layers, heads fully trained; rank, alpha and dropout
            come from the trainer's `peft_config` when given, e.g. TRL's `ModelConfig` in the recipe, else r=16,
            alpha=32).
        tail_k (`int`, *optional*, defaults to `8`):
            Decoder layers trained in `tail` and `lora` modes.
        use_aux_embed (`bool`, *optional*, defaults to `False`):
            New models only: add zero-initialised segment-role embeddings.
        use_bigram (`bool`, *optional*, defaults to `False`):
            New models only: add a zero-initialised hashed bigram embedding.
        use_trigram (`bool`, *optional*, defaults to `False`):
            New models only: add a zero-initialised hashed trigram embedding.

    > GRPOConfig fields with other defaults

    Parameters:
        loss_type (`str`, *optional*, defaults to `"grpo"`):
            As in GRPOConfig, over sampled actions, with a decision in the place of a completion sequence and a
            sampled action in the place of a token (docs/config_fields.md): `"grpo"` takes each decision's mean over
            its samples and divides the sum by the decisions of the micro-batch, so every decision weighs the same
            (see `outcome_loss_weight`). GRPOConfig's default, `"dapo"`, normalises by the samples of all processes.

    > Distributed data parallel (TrainingArguments fields with other defaults)

    Parameters:
        ddp_broadcast_buffers (`bool`, *optional*, defaults to `False`):
            DDP broadcasts module buffers from rank 0 before every forward when `True`, which makes every forward a
            collective; processes run different numbers of forwards in a step (length groups under
            `max_batch_tokens`, rollout waves, skipped decisions) and would wait for each other forever. The
            buffers of a decoder backbone (rotary frequencies) are constants computed from its config, so there
            is nothing to broadcast.
        ddp_find_unused_parameters (`bool`, *optional*, defaults to `False`):
            Every step touches every trainable parameter (unused heads at weight 0), so DDP's search for unused
            parameters after each forward is not needed.
    """

    envs: list[str] = field(
        default_factory=lambda: ["hmm", "kelly", "newsvendor", "bandit", "nim"],
        metadata={"help": "Registered env names (see alea_trl.envs.register_env)."},
    )
    env_kwargs: dict[str, Any] | None = field(
        default=None, metadata={"help": "Constructor keyword arguments per env name."}
    )
    eps_per_env: int = field(default=16, metadata={"help": "Live episodes per env on each process."})
    max_batch: int = field(default=24, metadata={"help": "Most decisions packed into one rollout forward."})
    max_batch_tokens: int | None = field(
        default=None,
        metadata={"help": "Padded tokens of one forward; batches are split into length-grouped forwards within it."},
    )
    max_len: int = field(
        default=2048,
        metadata={"help": "Most tokens of one packed decision; longer ones reset their episode and are counted."},
    )
    sample_in_loss_forward: bool = field(
        default=True,
        metadata={"help": "num_iterations == 1: sample actions from the loss forward (no rollout forward)."},
    )
    pack_rows: bool = field(
        default=True,
        metadata={"help": "Let several decisions share a row of a forward, up to the longest one (less padding)."},
    )
    prefetch_observations: bool = field(
        default=True, metadata={"help": "Observe the next decisions in a background thread during the backward pass."}
    )
    dense_advance: str = field(
        default="best_of_k",
        metadata={
            "help": "How dense episodes advance: 'best_of_k' (the best of the k samples) or 'sample' (on-policy)."
        },
    )
    dense_update: str = field(
        default="all_actions_ascent",
        metadata={
            "help": "What trains dense decisions: 'all_actions_ascent' (the default: every legal action, toward the "
            "all-actions step made an ascent of E[Q] - beta KL, bounded), 'all_actions' (every legal action), "
            "'mirror' (every legal action, toward the mirror-descent target of E[Q] - beta KL) or 'sampled' (the k "
            "samples)."
        },
    )
    outcome_advantage: str = field(
        default="branch",
        metadata={"help": "Outcome decisions' advantage: 'rtg' (reward-to-go), 'branch' (env copies) or 'episode'."},
    )
    branch_limit: int = field(default=8, metadata={"help": "Most outcome decisions branched per batch of decisions."})
    branch_max_rounds: int = field(
        default=1000,
        metadata={
            "help": "Most continuation rounds (no-grad forwards) of one batch's branching; decisions still playing at "
            "the cap are valued by reward-to-go and counted in branch/capped."
        },
    )
    branch_explore: float = field(
        default=0.0,
        metadata={
            "help": "Share of uniform play in branch continuations (0: the policy plays on; values are then those of "
            "the mixed policy). Keeps sparse, all-or-nothing envs' branches informative once the policy is sure."
        },
    )
    outcome_loss_weight: float = field(
        default=1.0,
        metadata={"help": "Weight of an outcome env's decision in the policy loss (a dense env's decision weighs 1)."},
    )
    outcome_baseline_window: int = field(
        default=64, metadata={"help": "Outcome envs: recent returns per env (and step) used to normalise a return."}
    )
    on_env_error: str = field(
        default="raise",
        metadata={"help": "Malformed decision, target or reward: 'raise' a ValueError, or 'skip' (reset and count)."},
    )
    eval_episodes: int = field(default=32, metadata={"help": "Episodes per env played greedily by evaluate()."})
    report_w: float = field(default=1.0, metadata={"help": "Weight of the proper-scoring report loss."})
    lr_head: float = field(default=2e-5, metadata={"help": "Learning rate of the heads."})
    lr_aux: float = field(default=1e-4, metadata={"help": "Learning rate of the input-side extras."})
    train_mode: str = field(default="tail", metadata={"help": "What trains: 'heads', 'tail', 'full' or 'lora'."})
    tail_k: int = field(default=8, metadata={"help": "Decoder layers trained in tail and lora modes."})
    use_aux_embed: bool = field(default=False, metadata={"help": "New models: zero-initialised role embeddings."})
    use_bigram: bool = field(default=False, metadata={"help": "New models: zero-initialised hashed bigram embedding."})
    use_trigram: bool = field(
        default=False, metadata={"help": "New models: zero-initialised hashed trigram embedding."}
    )

    # GRPOConfig fields whose defaults differ for decision training (values that suit one action per decision)
    learning_rate: float = field(default=5e-6, metadata={"help": "Learning rate of the backbone."})
    beta: float = field(default=0.05, metadata={"help": "Weight of the exact KL to the reference policy."})
    loss_type: str = field(
        default="grpo",
        metadata={"help": "Policy-loss formulation; 'grpo' (= 'bnpo' = 'luspo' here): the mean over sampled actions."},
    )
    delta: float | None = field(
        default=4.0,
        metadata={
            "help": "Two-sided clipping: the unclipped ratio term is capped at delta, which bounds a stale replay's "
            "loss under a negative advantage (None: off)."
        },
    )
    num_generations: int | None = field(default=8, metadata={"help": "k: actions sampled per decision."})
    num_generations_per_env: dict[str, int] | str | None = field(
        default=None,
        metadata={"help": "k by env name for the named envs (others: num_generations), e.g. '{\"nim\": 16}'."},
    )
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Decisions per loss forward."})
    logging_steps: float = field(default=10, metadata={"help": "Log every this many optimizer steps."})
    ddp_broadcast_buffers: bool | None = field(
        default=False,
        metadata={
            "help": "DDP: broadcast buffers before every forward (a collective per forward; processes run "
            "different numbers of forwards here). Off: decoder buffers are constants."
        },
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={"help": "DDP: search the graph for unused parameters. Off: every step touches every parameter."},
    )

    def __post_init__(self):
        # Rows of an Alea generation batch are decisions, each holding its own k samples, so GRPOConfig's check that
        # the generation batch holds whole groups of `num_generations` completions does not apply: the parent runs
        # with a stand-in that passes it, and k is validated here.
        if self.bf16 is None and not self.fp16 and not _accelerator_available():
            self.bf16 = False  # TRL's default (bf16) needs a GPU; on a CPU-only machine train in fp32
        check_inherited_fields(self)  # before TRL's checks, so a refused field is named as the user set it
        check_process_group_backend(self)  # before DeepSpeed's own batch check fails on it, deep in the run
        pacing_field = next((f for f in ("steps_per_generation", "generation_batch_size") if getattr(self, f)), None)
        k = self.num_generations
        self.num_generations = _WholeGroups(2)
        try:
            super().__post_init__()
        finally:
            self.num_generations = k
        if not isinstance(k, int) or k < 2:
            raise ValueError(f"AleaEnvGRPOConfig: field 'num_generations': must be an integer >= 2 (k), got {k!r}")
        fold_trust_remote_code(self)
        if isinstance(self.envs, str):
            self.envs = [e.strip() for e in self.envs.split(",") if e.strip()]
        if not self.envs:
            raise ValueError("AleaEnvGRPOConfig: field 'envs': needs at least one env name")
        if len(set(self.envs)) != len(self.envs):
            raise ValueError(f"AleaEnvGRPOConfig: field 'envs': names must be distinct, got {self.envs}")
        checks = [
            ("train_mode", self.train_mode in TRAIN_MODES, f"one of {TRAIN_MODES}"),
            ("dense_advance", self.dense_advance in DENSE_ADVANCE, f"one of {DENSE_ADVANCE}"),
            ("dense_update", self.dense_update in DENSE_UPDATES, f"one of {DENSE_UPDATES}"),
            ("on_env_error", self.on_env_error in ENV_ERROR_MODES, f"one of {ENV_ERROR_MODES}"),
            ("eps_per_env", self.eps_per_env >= 1, "an integer >= 1"),
            ("max_batch", self.max_batch >= 1, "an integer >= 1"),
            ("max_len", self.max_len >= 8, "an integer >= 8"),
            ("tail_k", self.tail_k >= 1, "an integer >= 1"),
            ("outcome_baseline_window", self.outcome_baseline_window >= 2, "an integer >= 2"),
            ("outcome_advantage", self.outcome_advantage in OUTCOME_ADVANTAGES, f"one of {OUTCOME_ADVANTAGES}"),
            ("branch_limit", self.branch_limit >= 0, "an integer >= 0"),
            ("branch_max_rounds", self.branch_max_rounds >= 1, "an integer >= 1"),
            ("branch_explore", 0.0 <= self.branch_explore <= 1.0, "a number in [0, 1]"),
            ("outcome_loss_weight", self.outcome_loss_weight >= 0, "a number >= 0"),
            ("report_w", self.report_w >= 0, "a number >= 0"),
            ("max_steps", self.max_steps > 0, "a positive number of steps (there is no dataset epoch)"),
        ]
        for name, ok, what in checks:
            if not ok:
                raise ValueError(f"AleaEnvGRPOConfig: field '{name}': must be {what}, got {getattr(self, name)!r}")
        if self.branch_explore > 0 and self.outcome_advantage != "branch":
            raise ValueError(
                f"AleaEnvGRPOConfig: field 'branch_explore': {self.branch_explore} mixes uniform play into branch "
                f"continuations, but outcome_advantage={self.outcome_advantage!r} does not branch"
            )
        if self.max_batch_tokens is not None and self.max_batch_tokens < self.max_len:
            raise ValueError(
                f"AleaEnvGRPOConfig: field 'max_batch_tokens': must be at least max_len={self.max_len} so that any "
                f"valid decision fits in a forward, got {self.max_batch_tokens}"
            )
        self.num_generations_per_env = _env_integers(self, "num_generations_per_env", minimum=2)
        check_resolved_fields(self)
        check_generation_pacing(self, pacing_field)


def _env_integers(args, name: str, minimum: int) -> dict[str, int]:
    """The dict field ``name`` (env name -> integer >= ``minimum``; a JSON string is accepted) checked, or a
    ``ValueError`` naming the field."""
    value = getattr(args, name)
    if value is None or value == {}:
        return {}
    where = f"AleaEnvGRPOConfig: field '{name}'"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not JSON ({err}): {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must map env names to integers, got {value!r}")
    for env, m in value.items():
        if env not in args.envs:
            raise ValueError(f"{where}: env {env!r} is not in envs {args.envs}")
        if isinstance(m, bool) or not isinstance(m, int) or m < minimum:
            raise ValueError(f"{where}: env {env!r}: must be an integer >= {minimum}, got {m!r}")
    return dict(value)


__all__ = ["AleaEnvGRPOConfig"]
