"""Learning curves from scratch: the normalised score of a tiny random-weight backbone trained with AleaEnvGRPOTrainer.

What it measures: a Qwen3-shaped backbone built from recipes/assets/tiny-qwen3 (4 layers x 128 by default, see
``--layers`` / ``--hidden``; random weights, local tokenizer) with the zero-initialised input extras on (hashed bigram
and trigram embeddings, segment-role embeddings: they let a tiny model see "pays 2", "Beta(4" or "2 heads" as one
feature) is trained on CPU, all weights, with GRPO on all five built-in envs (hmm, kelly, newsvendor: dense rewards;
bandit, nim: outcome rewards) plus the report losses: AdamW at ``--lr`` (backbone, heads and extras), ``--warmup``
steps of warm-up then cosine decay to 0, ``--batch_size`` decisions per step and process. ``--mix`` sets the training
share of an env by its number of copies (the default ``hmm=9,kelly=2,bandit=3,nim=3``, newsvendor one copy: 18 in all,
so hmm trains on half the decisions, bandit and nim on 3/18 each, kelly on 2/18, newsvendor on 1/18). hmm, whose state
must really be read, gets the most. The outcome envs get three shares each: with two, bandit stalled at 0.56 on one
seed of four and nim ended under 0.6 on another. Copies add episodes, not loss weight: every decision weighs the
same in the loss, an outcome env's times ``--outcome_loss_weight`` (2 here: a step trains about twice as many dense
decisions as outcome ones, 13.4 and 6.6 of a process's 20, so at 2 the two kinds pull about equally, the balance the
figures in ``benchmarks/RESULTS.md`` were measured with).
Dense decisions train on every legal action's exact expected reward (the library's default ``dense_update``);
``--dense_update sampled`` trains them on their k samples, GRPO's update, under which hmm ends near its prior
(``benchmarks/RESULTS.md``). Outcome decisions are valued by branching (the library's default ``outcome_advantage``):
each of a decision's k samples is played to the end in a copy of the env. nim samples k = 16
(``--num_generations_per_env nim=16``), the other envs 8: with 8 draws over nim's 3 to 9 legal moves the winning move is
often missing from the group and the others get one or two ±1 returns each, while a bandit branch, 16 times over its
remaining pulls, would cost most of the step (``benchmarks/RESULTS.md``).

Two processes. On a 2-core CPU the default command is
``accelerate launch --config_file accelerate_configs/cpu_2proc.yaml benchmarks/learning.py``: one training process
per core (DDP over gloo, each process with its own episode pool seeded by its rank), so a step trains on 2 x 20
decisions, and the evaluation episodes are shared out between the processes and their figures reduced (the same
episodes and the same figures as one process). One process (``python benchmarks/learning.py``) trains half the
decisions a step and is cut short by ``--budget_s``.

Advantages are scaled by each decision's own std (``--scale_rewards group``, TRL's and the library's default: the std of
its legal actions' expected rewards, or of its k samples' rewards with ``--dense_update sampled``) and the report losses
weigh ``--report_w 6.7``. Group scaling gives every dense decision whose actions differ advantages of about +-1, so hmm's
decisions where the symbols overturn the prior, often near-ties, weigh as much as the prior's clear ones; with one std
per env (``batch``, measured with the sampled update) they weigh almost nothing and hmm ends at or below the prior. The
report weight keeps that policy term from drowning the report losses: at ``report_w`` 1, with group scaling, a few
dimensions of the residual stream grow large on every token and the heads stop depending on the state. With one
weight per decision a step's policy term is the sum of its 20 decisions' terms over 20 (about 13.4 dense and 6.6
outcome ones, the outcome ones at weight 2); 6.7 sets the report losses against it as the runs behind the mix, the
scaling and the 1500-step figures had them (at 10, hmm ends at 0.59 on seed 0 instead of 0.97).
``benchmarks/RESULTS.md`` has the runs behind the mix, the scaling and the report weight.

Before training and every ``--eval_every`` optimizer steps the policy plays ``--eval_episodes`` paired episodes per
env with ``evaluate_policy`` (greedy act head: the reported figure), always on the same evaluation seed, so every
point of a curve plays the same episodes as the random and oracle policies. The figure is the normalised score
``(policy - random) / (oracle - random)``: 0 is random play, 1 is oracle play. For the dense envs it is computed
from exact expected rewards (``expected_score`` of ``evaluate_policy``: the expected reward of each action taken,
against the mean and the best expected reward at the same decision), which removes the outcome noise: with realised
returns it is larger than the gap between two policies over a few hundred decisions. The JSON also keeps the
realised-return curves (``curves_realised``).

Env instances: by default (``--env_kwargs small``) hmm and nim are smaller than the library defaults, sized for a tiny
from-scratch model (``SMALL`` in ``learning_parts/references.py``): hmm with 2 regimes, 2 symbols, sharper emissions
(``emit_alpha`` 0.3) and a horizon of 3, nim with 3 piles of 1..3 stones. Training and evaluation use the same
instances; ``--env_kwargs default`` runs the library defaults (too hard for this model in a run of this length, see
``SMALL``) and a JSON object sets any env's kwargs. Outcome envs (bandit, nim) are evaluated on
``--eval_episodes_outcome`` episodes: their returns are noisier than the dense envs' expected rewards.

Targets: every env's score ends above its init score, and the dense envs reach >= 0.5. The "final" score is the mean
of the last two evaluations (it smooths the jitter of a greedy policy between checkpoints); "best" is the best single
evaluation after init. The "const" column is the best state-blind policy ("always play option i") on the same
episodes: a policy at that level has learnt which option is good on average, not to read the state.

    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml benchmarks/learning.py   # 2 processes, 2 cores
    python benchmarks/learning.py --quick          # a smoke run, one process
    python benchmarks/learning.py --seeds 0,1      # one training run per seed, curves averaged over the seeds

The printout and the JSON (``report_skill``) also give each env's report skill per question type, ``1 - loss / loss of
the no-skill forecast`` (choice against uniform, noul against 1/2, regress against the pooled target quantiles): it
shows whether the backbone reads the part of the state a report asks about, apart from the act head. For hmm two
references put those figures in scale (``hmm_reference``, ``hmm_next_regime_skill``): the expected scores of
hand-written policies (the start row; the *prior*, i.e. the start row pushed through the transitions, which never reads
a symbol and already scores well above random play on the small instance; the last symbol's emission row; start times
emission), and the ``next_regime`` skill of the prior and oracle forecasts. An act score near the prior's with a
``choice`` skill at the prior forecast's means that the option read-out does not look the symbols up in the emission
table. ``hmm_ceiling.py`` trains the same backbone on hmm with the oracle's act as a supervised target: the ceiling of
this model on these episodes, against which the GRPO figures here are read.

Torch runs on one thread by default (``--threads``): on a CPU shared with other work, extra threads spin-wait for a
core and slow a run down several times. On an idle machine ``--threads 2`` is faster, but its float reductions run in
another order, so a run does not repeat the 1-thread run's numbers.
By default (``--steps 0``) the schedule is a function of the seconds of ``--budget_s`` (840 s a run,
``learning_parts/time_schedule.py``): a linear warm-up over ``--warmup`` steps, the peak rate until the last
``--decay_share`` (0.2) of the training time, then a cosine decay to 0 that ends with the training time, and ``--evals``
evaluations at evenly spaced seconds, the last at the end. So the default command is one complete run that ends on
time, however its steps speed up as the policy sharpens (they do: continuations share their forwards more and more).
``--steps N`` runs N steps with the step-based schedule (``--schedule``, cosine by default); with a budget it stops
at an evaluation when the next block would pass it (its schedule then ends part way); ``--steps 1500 --budget_s 0`` is
the long run behind the figures recorded before 2026-12-07. The JSON gives each
evaluation point's seconds since training began (``curves_seconds``) beside its step.
Prints a table (env x evaluation step) and, last, one JSON line with the figures; writes the curves to
``<out>/learning_curves.png`` and the JSON to ``<out>/learning.json``. Figures of past runs, with their commands and
settings: ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from accelerate import PartialState
from learning_parts.references import DENSE, ENVS, EVAL_SEED, SCORE_KEY, SMALL
from learning_parts.report import report
from learning_parts.time_schedule import TimeSchedule
from torch.optim.lr_scheduler import LambdaLR
from transformers import AutoConfig, AutoTokenizer, TrainerCallback

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel, end_distributed
from alea_trl.envs.registry import RegisteredEnvFactory
from alea_trl.evaluation import evaluation_sums, table_from_means


ROOT = Path(__file__).resolve().parents[1]
ASSET = ROOT / "recipes" / "assets" / "tiny-qwen3"
STEP_CAP = 20_000  # --steps 0: the step count is a cap only, the schedule's seconds end the run


class CurveCallback(TrainerCallback):
    """Evaluates the policy every ``every`` optimizer steps (and at init) and records the normalised scores."""

    def __init__(
        self, trainer_ref: dict, tokenizer, every, episodes, max_len, batch_size, budget, factories, schedule=None
    ):
        self.trainer_ref, self.tokenizer, self.factories = trainer_ref, tokenizer, factories
        self.every, self.episodes, self.max_len, self.batch_size = every, episodes, max_len, batch_size
        self.budget, self.t0 = budget, time.perf_counter()
        self.schedule: TimeSchedule | None = schedule  # --steps 0: evaluations and the end in seconds
        # (step, {env: score}, seconds of this evaluation, seconds since training began)
        self.points: list[tuple[int, dict[str, float], float, float]] = []
        self.realised: list[dict[str, float]] = []  # {env: normalised score of the realised returns}, per point
        self.skill: list[dict[str, dict[str, float]]] = []  # {env: {qtype: report skill}}, per point

    def evaluate(self, step: int) -> None:
        trainer = self.trainer_ref["trainer"]
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        t0 = time.perf_counter()
        # each env with its own episode count, episode i seeded [EVAL_SEED, 0, i]; under several processes each plays
        # its share of the episodes and the sums are reduced
        sums = evaluation_sums(
            model,
            self.tokenizer,
            {env: self.factories[env] for env in ENVS},
            episodes=self.episodes,
            seed=EVAL_SEED,
            greedy=True,
            max_len=self.max_len,
            batch_size=self.batch_size,
            shard=(trainer.accelerator.process_index, trainer.accelerator.num_processes),
        )
        table = table_from_means(trainer.gathered_means(sums))
        model.train(was_training)
        scores = {env: float(table[env][SCORE_KEY[env]]) for env in ENVS}
        self.realised.append({env: float(table[env]["normalized_score"]) for env in ENVS})
        self.skill.append(
            {env: {k[6:]: float(v) for k, v in table[env].items() if k.startswith("skill/")} for env in ENVS}
        )
        self.baselines = {env: (table[env]["random"], table[env]["oracle"]) for env in ENVS}
        self.points.append((step, scores, time.perf_counter() - t0, time.perf_counter() - self.t0))
        if trainer.accelerator.is_main_process:
            goals = {e: table[e]["goal_share"] for e in ENVS if "goal_share" in table[e]}  # goal-reaching envs
            shown = "  ".join(
                f"{e} {s:+.3f}" + (f" (goal {goals[e]:.2f})" if e in goals else "") for e, s in scores.items()
            )
            print(f"  step {step:>4}  {shown}  ({self.points[-1][2]:.0f}s)", flush=True)

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()
        self.evaluate(0)
        if self.schedule is not None:
            self.schedule.set_end(self.points[0][2], self.trainer_ref["trainer"].accelerator)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if self.schedule is not None:
            evaluate, stop = self.schedule.tick(self.trainer_ref["trainer"].accelerator)
            if evaluate or step == state.max_steps:
                self.evaluate(step)
            if stop:  # never clears a stop that another callback (or max_steps) asked for
                control.should_training_stop = control.should_log = True
            return
        if step % self.every == 0 or step == state.max_steps:
            self.evaluate(step)
            elapsed = time.perf_counter() - self.t0  # stop here if the next block (steps + evaluation) would overrun
            accelerator = self.trainer_ref["trainer"].accelerator
            elapsed = float(accelerator.reduce(torch.tensor([elapsed]), reduction="mean"))  # one decision for all
            next_block = elapsed / (len(self.points) - 1)
            if self.budget and step < state.max_steps and elapsed + next_block > self.budget:
                if accelerator.is_main_process:
                    print(f"  time budget: {elapsed:.0f}s spent, the next block would pass {self.budget:.0f}s; stop")
                control.should_training_stop = True


class TimeScheduledTrainer(AleaEnvGRPOTrainer):
    """The trainer with, when ``schedule`` is given, a learning rate that follows the seconds the run has spent
    (:class:`~learning_parts.time_schedule.TimeSchedule`) instead of its step count."""

    def __init__(self, *args, schedule: TimeSchedule | None = None, **kwargs):
        self.time_schedule = schedule
        super().__init__(*args, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.time_schedule is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        self.lr_scheduler = LambdaLR(optimizer if optimizer is not None else self.optimizer, self.time_schedule.factor)
        return self.lr_scheduler


# (name, type, default, help): the hyper-parameters a run records with its figures
TRAINING_HPARAMS = [
    ("lr", float, 1.5e-3, "backbone (and extras) learning rate"),
    ("lr_head", float, 1.5e-3, "heads learning rate"),
    ("lr_aux", float, 0.0, "extras learning rate (0: --lr)"),
    ("schedule", str, None, "lr_scheduler_type after --warmup steps, --steps N only (default cosine)"),
    ("warmup", int, 24, "warm-up steps"),
    ("beta", float, 0.0, "KL weight"),
    ("temperature", float, 1.0, "sampling temperature of the act head"),
    ("num_generations", int, 8, "k, actions sampled per decision"),
    ("num_generations_per_env", str, "nim=16", "k by env for the named envs (others: --num_generations); '' for none"),
    ("eps_per_env", int, 8, "live episodes per env and process"),
    ("max_batch", int, 40, "decisions per separate rollout forward (num_iterations > 1)"),
    ("batch_size", int, 20, "per_device_train_batch_size (decisions per step)"),
    ("report_w", float, 6.7, "report loss weight (see the module docstring)"),
    ("max_grad_norm", float, 1.0, "gradient clipping (the Trainer's max_grad_norm)"),
    ("weight_decay", float, 0.0, "AdamW weight decay (not on biases or norm weights)"),
    ("scale_rewards", str, "group", "group, batch (one std per env) or none"),
    ("max_batch_tokens", int, 2048, "padded tokens per forward (0: one forward)"),
    ("mix", str, "hmm=9,kelly=2,bandit=3,nim=3", "training copies per env, e.g. hmm=3,bandit=0 (evaluation: all)"),
    ("dense_advance", str, "best_of_k", "best_of_k or sample"),
    (
        "dense_update",
        str,
        AleaEnvGRPOConfig.dense_update,
        "dense decisions: all_actions (every legal action) or sampled (the k samples)",
    ),
    ("num_iterations", int, 1, "optimizer steps per rollout batch"),
    (
        "outcome_advantage",
        str,
        AleaEnvGRPOConfig.outcome_advantage,
        "outcome decisions: branch (env copies), rtg (reward-to-go) or episode",
    ),
    ("branch_limit", int, 8, "most outcome decisions branched per batch (outcome_advantage branch)"),
    ("outcome_loss_weight", float, 2.0, "weight of an outcome env's decision in the loss (a dense env's: 1)"),
    ("entropy_coef", float, 0.0, "entropy bonus coefficient (the initial one with --adaptive_entropy)"),
    ("adaptive_entropy", int, 0, "1: TRL's adaptive entropy control (use_adaptive_entropy) towards --entropy_target"),
    ("entropy_target", float, 0.2, "mean act entropy (nats) the adaptive control keeps"),
]
MODEL_HPARAMS = [
    ("layers", int, 4, "backbone decoder layers"),
    ("hidden", int, 128, "backbone width (MLP 2x, 32-wide heads)"),
    ("bigram", int, 1, "hashed bigram embedding (use_bigram)"),
    ("trigram", int, 1, "hashed trigram embedding (use_trigram)"),
    ("aux_embed", int, 1, "segment-role embedding (use_aux_embed)"),
]


def add_hparams(parser, hparams) -> None:
    """One ``--name`` option per ``(name, type, default, help)`` row."""
    for name, kind, default, text in hparams:
        parser.add_argument(f"--{name}", type=kind, default=default, help=text)


def cpu_run(seed: int, logging_steps: int) -> dict:
    """The Trainer settings every run of these benchmarks shares: fp32 on the CPU, no saving or progress bars."""
    return dict(
        use_cpu=True, bf16=False, gradient_checkpointing=False, save_strategy="no", report_to="none", disable_tqdm=True
    ) | {"seed": seed, "logging_steps": logging_steps}


def optimisation(args) -> dict:
    """The optimisation settings of a run (all weights train), from the hyper-parameters."""
    lrs = {"learning_rate": args.lr, "lr_head": args.lr_head, "lr_aux": args.lr_aux or args.lr}
    # --steps 0: TimeScheduledTrainer sets its own scheduler (in seconds) in place of Trainer's
    kind = args.schedule if args.steps else "constant"
    schedule = {"lr_scheduler_type": kind, "warmup_steps": args.warmup, "max_grad_norm": args.max_grad_norm}
    steps = {"max_steps": args.steps, "per_device_train_batch_size": args.batch_size}
    return {"train_mode": "full", "report_w": args.report_w} | lrs | schedule | steps


def tiny_model(args) -> AleaModel:
    """A fresh random-weight Qwen3-shaped AleaModel of ``args.layers`` x ``args.hidden`` (MLP 2x, 32-wide heads) with
    the input extras ``args.bigram`` / ``args.trigram`` / ``args.aux_embed``, in float32."""
    shape = {"num_hidden_layers": args.layers, "hidden_size": args.hidden, "intermediate_size": 2 * args.hidden}
    shape["layer_types"] = ["full_attention"] * args.layers
    shape["num_attention_heads"] = max(1, args.hidden // 32)
    shape["num_key_value_heads"] = max(1, args.hidden // 64)
    return AleaModel.from_backbone(
        AutoConfig.from_pretrained(ASSET, **shape),
        backbone_kwargs={"dtype": torch.float32},
        use_bigram=args.bigram,
        use_trigram=args.trigram,
        use_aux_embed=args.aux_embed,
    )


def env_integers(text: str) -> dict[str, int]:
    """``"hmm=9,nim=2"`` as ``{"hmm": 9, "nim": 2}``."""
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}


def train_one(args, seed: int) -> tuple[list, dict, list, list]:
    """One training run from a fresh random backbone; returns the evaluation points, the random / oracle returns of
    the evaluation episodes and, per point, every env's normalised score of the realised returns and report skills.
    With ``--steps 0`` its learning rate, evaluations and end follow the seconds of ``--budget_s``
    (:class:`~learning_parts.time_schedule.TimeSchedule`; the step count is only a cap)."""
    schedule = TimeSchedule(args.budget_s, args.warmup, args.decay_share, args.evals) if args.steps == 0 else None
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(ASSET)
    model = tiny_model(args)
    weights = {env: 1 for env in ENVS} | env_integers(args.mix)
    weights = {env: w for env, w in weights.items() if env in ENVS}
    k_env = env_integers(args.num_generations_per_env)
    # an env of weight w trains as w copies (fair round-robin over names: w shares of each wave and batch)
    kw = args.env_kwargs
    copy_of = {f"{e}_{i}" if i else e: e for e, w in weights.items() for i in range(w)}
    copies = {name: RegisteredEnvFactory(e, kw.get(e)) for name, e in copy_of.items()}
    config = AleaEnvGRPOConfig(
        output_dir=os.path.join(args.out, f"seed{seed}"),
        envs=list(copies),
        **optimisation(args) | ({"max_steps": STEP_CAP} if schedule is not None else {}),
        dense_advance=args.dense_advance,
        dense_update=args.dense_update,
        outcome_advantage=args.outcome_advantage,
        branch_limit=args.branch_limit,
        outcome_loss_weight=args.outcome_loss_weight,
        entropy_coef=args.entropy_coef,
        use_adaptive_entropy=bool(args.adaptive_entropy),
        entropy_target=args.entropy_target,
        num_iterations=args.num_iterations,
        beta=args.beta,
        temperature=args.temperature,
        num_generations=args.num_generations,
        num_generations_per_env={name: k_env[e] for name, e in copy_of.items() if e in k_env},
        eps_per_env=args.eps_per_env,
        max_batch=args.max_batch,
        max_len=1024,
        max_batch_tokens=args.max_batch_tokens or None,  # length-grouped forwards: the same loss, less padding
        weight_decay=args.weight_decay,
        scale_rewards=args.scale_rewards,
        **cpu_run(seed, args.logging_steps or args.steps or STEP_CAP),  # --steps 0: one log, where the run stops
    )
    ref: dict = {}
    callback = CurveCallback(
        ref,
        tokenizer,
        args.eval_every,
        args.episodes,
        config.max_len,
        config.max_batch,
        args.budget_s if schedule is None else 0,
        {env: RegisteredEnvFactory(env, kw.get(env)) for env in ENVS},  # evaluation: the same env instances
        schedule,
    )
    trainer = TimeScheduledTrainer(
        model, args=config, processing_class=tokenizer, env_factories=copies, callbacks=[callback], schedule=schedule
    )
    ref["trainer"] = trainer
    trainer.train()
    if schedule is not None:  # each seed's schedule, in seed order
        args.fitted = (args.fitted or []) + [schedule.summary() | {"seed": seed, "steps": trainer.state.global_step}]
    return callback.points, callback.baselines, callback.realised, callback.skill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps",
        type=int,
        default=0,
        help="optimizer steps per run; 0: a schedule in seconds of --budget_s (a complete run that ends on time; "
        "1500 with --budget_s 0 is the long run of the figures before 2026-12-07)",
    )
    parser.add_argument(
        "--eval_every",
        type=int,
        default=None,
        help="--steps N: evaluate every this many optimizer steps (default 250)",
    )
    parser.add_argument(
        "--evals", type=int, default=None, help="--steps 0: evaluations after the initial one (default 6)"
    )
    parser.add_argument(
        "--decay_share",
        type=float,
        default=None,
        help="--steps 0: the share of the budget's training time, at its end, over which the rate decays to 0 "
        "(default 0.2)",
    )
    parser.add_argument("--eval_episodes", type=int, default=100, help="evaluation episodes per dense env")
    parser.add_argument(
        "--eval_episodes_outcome",
        type=int,
        default=150,
        help="evaluation episodes per outcome env (0: --eval_episodes)",
    )
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (one run each)")
    parser.add_argument("--out", default="runs/bench_learning")
    parser.add_argument(
        "--budget_s",
        type=float,
        default=840,
        help="per run: with --steps 0 the schedule's seconds; with --steps N a run stops at an evaluation if the "
        "next would pass it (0: off)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute (few steps, few episodes)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: on a shared CPU, more threads spin and stall)"
    )
    add_hparams(parser.add_argument_group("hyper-parameters"), TRAINING_HPARAMS + MODEL_HPARAMS)
    parser.add_argument("--envs", default="", help="comma-separated subset of the envs (a probe; default: all five)")
    parser.add_argument(
        "--env_kwargs",
        default="small",
        help="env instances, for training and evaluation: 'small' (SMALL), 'default' (the library defaults) or JSON "
        '{env: {kwarg: value}}, e.g. \'{"nim": {"n_piles": 3}}\'',
    )
    parser.add_argument("--logging_steps", type=int, default=0, help="trainer log every N steps (0: at the end)")
    args = parser.parse_args()
    args.hparam_names = [name for name, *_ in TRAINING_HPARAMS + MODEL_HPARAMS]
    if args.quick:
        args.steps, args.eval_every, args.eval_episodes, args.warmup, args.eval_episodes_outcome = 20, 10, 20, 2, 0
        args.budget_s = 0
    if args.envs:  # a probe on a subset of the envs (in place: learning_parts reads the same list)
        ENVS[:] = [e for e in ENVS if e in args.envs.split(",")]
    n_out = args.eval_episodes_outcome or args.eval_episodes
    args.episodes = {env: args.eval_episodes if env in DENSE else n_out for env in ENVS}
    presets = {"small": SMALL, "default": {}}
    args.env_kwargs = presets[args.env_kwargs] if args.env_kwargs in presets else json.loads(args.env_kwargs)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)

    state = PartialState(cpu=True)  # one process, or one of several under `accelerate launch`
    t0 = time.perf_counter()
    args.fitted = None
    if args.steps == 0 and not args.budget_s:
        raise SystemExit("--steps 0 fits the schedule to --budget_s: give a budget, or --steps N")
    by_steps, by_seconds = ("schedule", "eval_every"), ("evals", "decay_share")  # each mode's own options
    own, other = (by_steps, by_seconds) if args.steps else (by_seconds, by_steps)
    wrong = [name for name in other if getattr(args, name) is not None]
    if wrong:
        mode = "--steps N (a schedule in steps)" if args.steps else "--steps 0 (a schedule in the budget's seconds)"
        raise SystemExit(f"--{wrong[0]} does not apply to {mode}, whose options are --{own[0]} and --{own[1]}")
    defaults = {"schedule": "cosine", "eval_every": 250, "evals": 6, "decay_share": 0.2}
    for name in own:
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    runs, realised, skills = [], [], []
    for seed in seeds:
        if state.is_main_process:
            length = f"{args.steps} steps" if args.steps else f"a schedule of {args.budget_s:.0f} s"
            every = f"every {args.eval_every} steps" if args.steps else f"{args.evals} times"
            print(
                f"seed {seed}: {length} x {args.batch_size} decisions x {state.num_processes} process(es), "
                f"evaluating {every} on {args.episodes} episodes"
            )
        points, baselines, realised_scores, skill = train_one(args, seed)
        runs.append(points)
        realised.append(realised_scores)
        skills.append(skill)
    wall = time.perf_counter() - t0
    if state.is_main_process:  # every process holds the same (reduced) curves
        report(args, seeds, runs, realised, skills, baselines, wall, state.num_processes)
    end_distributed()


if __name__ == "__main__":
    main()
