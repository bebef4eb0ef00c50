"""Learning benchmark rows for Gymnasium envs: FrozenLake 4x4 (slippery) and Blackjack, from scratch.

The learning benchmark's model, trainer settings and report (``learning.py``: a 4 x 128 Qwen3-shaped backbone with
random weights and the input extras, all weights trained with GRPO on CPU; the table, the PNG of the curves and the
JSON line), on the registered Gymnasium envs ``gym-frozenlake-4x4`` and ``gym-blackjack``. Both are dense: the
adapter's oracle is Q* from the env's own model (value iteration on FrozenLake's transition table over its 100-step
horizon, the exact dynamic programme of Blackjack over the infinite deck), so each decision is a GRPO group scored
by ``Q*(s, a)``.

The figure is the normalised score of the realised returns, ``(policy - random) / (optimal - random)``, on paired
evaluation episodes: the greedy policy, random play and the oracle (the value-iteration / DP optimum) play the same
seeded episodes, and an episode the policy plays exactly as the oracle gives the oracle's return, so the noise comes
only from the decisions where the two differ. FrozenLake is evaluated on 100 episodes and Blackjack on 1000 (its
hands are one or two decisions, its returns noisier). ``best_constant`` is the best state-blind policy.

    python benchmarks/learning_gym.py --seeds 0 --budget_s 0             # both envs, 300 steps, one process
    python benchmarks/learning_gym.py --envs gym-blackjack --seeds 0,1,2,3 --steps 150 --eval_every 75 --budget_s 0
    python benchmarks/learning_gym.py --quick                             # a smoke run
    python benchmarks/learning_gym.py --envs gym-taxi --env_kwargs '{"gym-taxi": {"render": "short"}}' \
        --scale_rewards none --steps 4000 --eval_every 2000 --budget_s 0 --seeds 0   # Taxi, opt-in (50 episodes)

Taxi is not in the default pair: its run takes 4000 steps, about 27 minutes. Its command differs from the pair's in
the three settings it was measured with. ``render: short`` states the taxi's cell, the passenger and the destination
without the map (about 250 tokens a decision with the questions, against about 445): the walls are learnt from the
rewards. ``--scale_rewards none`` keeps the advantages in Q* units: a decision's std over its six actions is dominated
by the two illegal ones (about 8 below the moves), so group scaling leaves a move one step better than another only
0.2-0.45 in its units. (Which of these two the run needs was not measured apart.) 4000 steps: a 1000-step run
delivered no evaluation episode, and in the 4000-step run the training regret was still 0.35 a decision at step
1500 and 0.19 at 2000 (``benchmarks/RESULTS.md``).

An env that has a goal (FrozenLake, Taxi) prints its share of evaluation episodes that reach it beside the score:
Taxi's normalised score counts the illegal pickups a policy avoids, so a policy that never delivers already scores
about 0.7.

Figures: ``benchmarks/RESULTS.md``. FrozenLake's optimal policy is mostly "left" and "up" (away from the goal,
against the slipping) and one wrong action at any of states 0, 4, 8 or 14 makes the return 0, so its
score is all or nothing. An evaluation of a policy that stalls plays 100 decisions per episode: minutes on CPU.

Both envs train with the library's default update, ``--dense_update all_actions_ascent`` (every legal action trains
the act toward a step computed from its Q*, see ``alea_trl.trainer.loss.dense``; ``--dense_update all_actions`` is
the plain all-actions update): with the sampled update FrozenLake's act collapses to one state-blind action before
it reads the position, its best actions' probabilities fall near 0 and the groups of k samples stop containing them,
so nothing brings them back (``--dense_update sampled`` reproduces it; ``benchmarks/RESULTS.md`` has the per-state
diagnosis).

Prints the table and, last, one JSON line; writes ``<out>/learning_curves.png`` and ``<out>/learning.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import learning  # the learning benchmark (a sibling script): its model, training run and hyper-parameters
import torch
from accelerate import PartialState
from learning_parts import references
from learning_parts.report import report

from alea_trl import end_distributed


GYM_ENVS = ["gym-frozenlake-4x4", "gym-blackjack"]
EPISODES = {"gym-frozenlake-4x4": 100, "gym-blackjack": 1000, "gym-taxi": 50}  # Taxi: opt-in (--envs gym-taxi)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    parser.add_argument("--eval_every", type=int, default=100, help="evaluate every this many optimizer steps")
    parser.add_argument("--eval_scale", type=float, default=1.0, help="multiplies the evaluation episodes per env")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (one run each)")
    parser.add_argument("--out", default="runs/bench_learning_gym")
    parser.add_argument("--budget_s", type=float, default=840, help="per run: stop at an evaluation past it (0: off)")
    parser.add_argument("--envs", default=",".join(GYM_ENVS), help=f"comma-separated envs, of {sorted(EPISODES)}")
    parser.add_argument("--quick", action="store_true", help="a smoke run (few steps, few episodes)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--env_kwargs", default="{}", help='JSON {env: {kwarg: value}}, e.g. \'{"gym-blackjack": {"sab": false}}\''
    )
    parser.add_argument("--logging_steps", type=int, default=0, help="trainer log every N steps (0: at the end)")
    learning.add_hparams(
        parser.add_argument_group("hyper-parameters"), learning.TRAINING_HPARAMS + learning.MODEL_HPARAMS
    )
    # train_one keeps the envs of --envs; every legal action's Q* trains the act (see the module docstring); the
    # report weight the figures were measured with (learning.py's 6.7 balances a mix with outcome envs, there are none)
    parser.set_defaults(mix=",".join(f"{e}=1" for e in EPISODES), report_w=10.0, schedule="cosine")
    args = parser.parse_args()
    args.hparam_names = [name for name, *_ in learning.TRAINING_HPARAMS + learning.MODEL_HPARAMS]
    if args.quick:
        args.steps, args.eval_every, args.warmup, args.eval_scale = 20, 10, 2, 0.05
    # the learning benchmark's env set, in place (train_one and report read these lists)
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    if not envs or any(e not in EPISODES for e in envs):
        parser.error(f"--envs: each must be one of {sorted(EPISODES)}, got {args.envs!r}")
    references.ENVS[:] = envs
    references.DENSE[:] = envs
    references.SCORE_KEY.update(dict.fromkeys(envs, "normalized_score"))
    args.episodes = {env: max(1, round(EPISODES[env] * args.eval_scale)) for env in envs}
    args.eval_episodes, args.eval_episodes_outcome = min(args.episodes.values()), 0  # the report's title
    args.env_kwargs = json.loads(args.env_kwargs)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)

    state = PartialState(cpu=True)
    t0 = time.perf_counter()
    runs, realised, skills = [], [], []
    for seed in seeds:
        if state.is_main_process:
            print(
                f"seed {seed}: {args.steps} steps x {args.batch_size} decisions, evaluating on {args.episodes} episodes"
            )
        points, baselines, realised_scores, skill = learning.train_one(args, seed)
        runs.append(points)
        realised.append(realised_scores)
        skills.append(skill)
    if state.is_main_process:
        report(args, seeds, runs, realised, skills, baselines, time.perf_counter() - t0, state.num_processes)
    end_distributed()


if __name__ == "__main__":
    main()
