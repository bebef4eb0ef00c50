"""What the act head can read from a frozen backbone: a linear probe of SmolLM2's option features, pretrained against
random weights.

What it measures: with the backbone frozen (``train_mode="heads"``) the act policy is ``softmax(w . h_o + b)`` over
the hidden states ``h_o`` of the act question's option tokens (``AleaModel.choice_head`` is one linear layer). So the
best that heads-only training can reach on a decision is what the best linear ``w`` reaches on those features. This
script fits that ``w`` directly, by full-batch cross-entropy against each decision's best action (L2-regularised, the
strength picked on a held-out part of the training decisions), and scores its greedy choice on held-out decisions
with the env's exact expected rewards.

- Decisions: for each dense env of ``benchmarks/pretrained.py`` (the instances of
  ``recipes/configs/smollm2_135m.yaml``), episodes under uniformly random actions, seeded; the act question alone is
  packed (its option hidden states are what the choice head reads). Episodes, not decisions, are split into train
  (75%) and test (25%).
- Features: the option tokens' hidden states after the first ``d`` Llama layers of SmolLM2-135M-Instruct, for each
  ``d`` of ``--depths``, through the model's final RMSNorm (as ``AleaModel`` reads them), with the pretrained weights
  and with random ones (transformers' initialisation, seeded). One forward of the deepest depth gives every depth.
- Score: ``(mean Q(pick) - mean Q(uniform)) / (mean max Q - mean Q(uniform))`` over test decisions (0: random play,
  1: the oracle's choice at every decision), beside the best state-blind choice (the option position with the
  highest mean Q on the training decisions) and the probe's training score (how much it fits).

Why: ``benchmarks/pretrained.py`` asks whether pretrained weights help an RL run; this asks the narrower question
behind it, whether the frozen features hold what the act needs at all, without the RL run's noise and budget.

    python benchmarks/readout_probe.py                        # 1,000 decisions an env, depths 4 and 8
    python benchmarks/readout_probe.py --decisions 60 --depths 2   # a smoke run

Prints a table and, last, one JSON line. Figures of past runs: ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from pretrained import ENV_KWARGS, ENVS, build_model  # the pretrained benchmark's envs and models (a sibling script)
from transformers import AutoTokenizer

from alea_trl.collate import collate_segments, pad_token_id
from alea_trl.envs.registry import RegisteredEnvFactory
from alea_trl.models import fetch
from alea_trl.packing import pack_request
from alea_trl.questions import ACT_QID, Decision


def play_decisions(env_name: str, n: int, seed: int) -> tuple[list[Decision], list[np.ndarray], list[int]]:
    """At least ``n`` decisions of ``env_name`` from whole episodes under uniformly random actions: the decisions
    (the act question alone), each one's exact expected rewards and its episode's index."""
    env = RegisteredEnvFactory(env_name, ENV_KWARGS.get(env_name))()
    decisions, rewards, episodes = [], [], []
    episode = 0
    while len(decisions) < n:
        env.reset(np.random.default_rng([seed, episode]))
        pick = np.random.default_rng([seed, episode, 1])
        while not env.done:
            decision = env.observe()
            act = next(q for q in decision.questions if q.qid == ACT_QID)
            decisions.append(Decision(decision.state, (act,), env=env_name))
            rewards.append(np.asarray(env.action_rewards(), dtype=np.float64))
            episodes.append(episode)
            env.step(int(pick.integers(decision.n_legal)))
        episode += 1
    return decisions, rewards, episodes


@torch.no_grad()
def option_features(model, tokenizer, decisions: list[Decision], depths: list[int], batch_size: int) -> dict:
    """Per depth, per decision, the ``(n_options, H)`` hidden states of the act options after ``depth`` layers,
    through the backbone's final norm."""
    model.eval()
    layers, norm = model.backbone.layers, model.backbone.norm
    captured: dict[int, torch.Tensor] = {}
    hooks = [
        layers[d - 1].register_forward_hook(
            lambda _m, _i, out, d=d: captured.__setitem__(d, out[0] if isinstance(out, tuple) else out)
        )
        for d in depths
    ]
    pad = pad_token_id(tokenizer)
    features: dict[int, list[torch.Tensor]] = {d: [] for d in depths}
    try:
        for start in range(0, len(decisions), batch_size):
            chunk = decisions[start : start + batch_size]
            batch = collate_segments([pack_request(tokenizer, x.state, x.questions, env=x.env) for x in chunk], pad)
            model(**batch.model_inputs())
            rows, cols = batch.option_index[:, 0], batch.option_index[:, 1]
            sizes = [len(x.questions[0].options) for x in chunk]
            for d in depths:
                h = norm(captured[d][rows, cols]).float()
                features[d] += list(torch.split(h, sizes))
    finally:
        for hook in hooks:
            hook.remove()
    return features


def fit_probe(feats: list[torch.Tensor], rewards: list[np.ndarray], l2: float, steps: int = 150) -> torch.Tensor:
    """The linear read-out ``w`` (with a bias feature) minimising the mean cross-entropy of ``softmax(F w)`` against
    each decision's best actions (ties share) plus ``l2 |w|^2``; full-batch L-BFGS."""
    width = max(f.shape[0] for f in feats)
    x = torch.zeros(len(feats), width, feats[0].shape[1] + 1)
    legal = torch.zeros(len(feats), width, dtype=torch.bool)
    target = torch.zeros(len(feats), width)
    for i, (f, q) in enumerate(zip(feats, rewards)):
        x[i, : f.shape[0], :-1], x[i, : f.shape[0], -1], legal[i, : f.shape[0]] = f, 1.0, True
        best = torch.as_tensor(q >= q.max() - 1e-9, dtype=torch.float32)
        target[i, : f.shape[0]] = best / best.sum()
    w = torch.zeros(x.shape[-1], requires_grad=True)
    optimizer = torch.optim.LBFGS([w], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        logits = (x @ w).masked_fill(~legal, float("-inf"))
        loss = (
            -(target * torch.log_softmax(logits, -1).masked_fill(~legal, 0.0)).sum(-1).mean()
            + l2 * w[:-1].square().sum()
        )
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach()


def score(picks: list[int], rewards: list[np.ndarray]) -> float:
    """The normalised score of the picks: 0 for uniform random play, 1 for the best action at every decision."""
    got = np.mean([q[p] for p, q in zip(picks, rewards)])
    uniform = np.mean([q.mean() for q in rewards])
    best = np.mean([q.max() for q in rewards])
    return float((got - uniform) / max(best - uniform, 1e-12))


def probe_picks(w: torch.Tensor, feats: list[torch.Tensor]) -> list[int]:
    return [int((f @ w[:-1]).argmax()) for f in feats]


def standardise(train: list[torch.Tensor], test: list[torch.Tensor]) -> tuple[list, list]:
    """Features centred and scaled by the training options' mean and std (per feature)."""
    every = torch.cat(train)
    mean, std = every.mean(0), every.std(0).clamp(min=1e-6)
    return [(f - mean) / std for f in train], [(f - mean) / std for f in test]


def run_probe(train_f, train_q, test_f, test_q, l2s: list[float]) -> dict:
    """Pick the L2 strength on the last fifth of the training decisions, refit on all of them, score on the test."""
    cut = int(len(train_f) * 0.8)
    val = {
        l2: score(probe_picks(fit_probe(train_f[:cut], train_q[:cut], l2), train_f[cut:]), train_q[cut:]) for l2 in l2s
    }
    l2 = max(val, key=val.get)
    w = fit_probe(train_f, train_q, l2)
    return {
        "test": score(probe_picks(w, test_f), test_q),
        "train": score(probe_picks(w, train_f), train_q),
        "l2": l2,
    }


def state_blind(train_q: list[np.ndarray], test_q: list[np.ndarray]) -> float:
    """The test score of the option position with the highest mean expected reward on the training decisions."""
    width = max(len(q) for q in train_q)
    sums, counts = np.zeros(width), np.zeros(width)
    for q in train_q:
        sums[: len(q)] += q
        counts[: len(q)] += 1
    means = np.where(counts > 0, sums / np.maximum(counts, 1), -np.inf)
    return score([min(int(np.argmax(means)), len(q) - 1) for q in test_q], test_q)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=1000, help="decisions per env (3/4 train, 1/4 test)")
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 8], help="Llama layers before the read-out")
    parser.add_argument("--l2s", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2, 1e-1], help="L2 strengths tried")
    parser.add_argument("--batch_size", type=int, default=16, help="decisions per forward")
    parser.add_argument("--seed", type=int, default=0, help="seed of the episodes and of the random weights")
    args = parser.parse_args()
    if args.decisions < 8:
        raise ValueError(f"readout_probe.py: field 'decisions': must be >= 8, got {args.decisions}")
    if not all(1 <= d <= 30 for d in args.depths):
        raise ValueError(f"readout_probe.py: field 'depths': every depth must be in [1, 30], got {args.depths}")
    started = time.perf_counter()
    path = fetch("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    data = {env: play_decisions(env, args.decisions, args.seed) for env in ENVS}
    results: dict = {}
    for weights in ("pretrained", "random"):
        model = build_model(path, weights, max(args.depths), args.seed)
        for env in ENVS:
            decisions, rewards, episodes = data[env]
            t0 = time.perf_counter()
            feats = option_features(model, tokenizer, decisions, sorted(args.depths), args.batch_size)
            seconds = time.perf_counter() - t0
            split = np.quantile(episodes, 0.75)
            is_train = [e <= split for e in episodes]
            train_q = [q for q, t in zip(rewards, is_train) if t]
            test_q = [q for q, t in zip(rewards, is_train) if not t]
            for d in args.depths:
                train_f = [f for f, t in zip(feats[d], is_train) if t]
                test_f = [f for f, t in zip(feats[d], is_train) if not t]
                train_f, test_f = standardise(train_f, test_f)
                row = run_probe(train_f, train_q, test_f, test_q, args.l2s)
                row["state_blind"] = state_blind(train_q, test_q)
                row["n_train"], row["n_test"], row["forward_s"] = len(train_q), len(test_q), round(seconds, 1)
                results.setdefault(env, {}).setdefault(str(d), {})[weights] = row
                print(f"  {env:<11} depth {d:>2} {weights:<10} test {row['test']:+.3f}  train {row['train']:+.3f}  "
                      f"l2 {row['l2']:g}", flush=True)  # fmt: skip
        del model
    print()
    head = f"{'env':<12}{'depth':>6}{'state-blind':>13}{'pretrained':>12}{'random':>10}{'pre. train':>12}{'rand. train':>13}"
    print(head)
    print("-" * len(head))
    for env in ENVS:
        for d in args.depths:
            r = results[env][str(d)]
            print(f"{env:<12}{d:>6}{r['pretrained']['state_blind']:>13.3f}{r['pretrained']['test']:>12.3f}"
                  f"{r['random']['test']:>10.3f}{r['pretrained']['train']:>12.3f}{r['random']['train']:>13.3f}")  # fmt: skip
    record = {
        "benchmark": "readout_probe",
        "model": "smollm2-135m-instruct",
        "decisions_per_env": args.decisions,
        "depths": args.depths,
        "seed": args.seed,
        "results": results,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
