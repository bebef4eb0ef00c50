"""The model card of a trained Alea model (RL and SFT), written with ``huggingface_hub.ModelCard``.

Design decisions:
1. The card is Alea's own, not TRL's text-generation card: its quick start loads the model with ``AleaModel`` and
   answers one env decision with ``predict``; it lists what the model answers (each env's questions and qtypes).
2. The base is what the run started from (an Alea checkpoint, a pretrained backbone, or a config with random
   weights); the ``base_model`` metadata is set only when that is a Hub id, so a local path never reaches the Hub.
3. The evaluation is both a markdown table and ``model-index`` metadata (one result per env), with the episodes and
   seed it was played on. Tags are sorted; no licence is claimed (the run does not know its base's).
4. The training config is the fields that differ from their defaults (never tokens, paths or Hub settings), so the
   run can be repeated; the citations are GRPO (RL), VinePPO (when outcome decisions branched), TRL, and the scoring
   rule of every qtype the envs ask.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.metadata
import json
import os

import numpy as np
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ...envs import BUILTIN_ENVS
from ...envs.registry import RegisteredEnvFactory


BIBTEX = {
    "grpo": """@article{shao2024deepseekmath,
  title   = {DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models},
  author  = {Shao, Zhihong and Wang, Peiyi and Zhu, Qihao and Xu, Runxin and Song, Junxiao and Bi, Xiao and
             Zhang, Haowei and Zhang, Mingchuan and Li, Y. K. and Wu, Y. and Guo, Daya},
  journal = {arXiv preprint arXiv:2402.03300},
  year    = {2024}
}""",
    "vineppo": """@article{kazemnejad2024vineppo,
  title   = {VinePPO: Unlocking RL Potential For LLM Reasoning Through Refined Credit Assignment},
  author  = {Kazemnejad, Amirhossein and Aghajohari, Milad and Portelance, Eva and Sordoni, Alessandro and
             Reddy, Siva and Courville, Aaron and Le Roux, Nicolas},
  journal = {arXiv preprint arXiv:2410.01679},
  year    = {2024}
}""",
    "proper": """@article{gneiting2007strictly,
  title   = {Strictly Proper Scoring Rules, Prediction, and Estimation},
  author  = {Gneiting, Tilmann and Raftery, Adrian E.},
  journal = {Journal of the American Statistical Association},
  volume  = {102}, number = {477}, pages = {359--378},
  year    = {2007}
}""",
    "choice": """@article{good1952rational,
  title   = {Rational Decisions},
  author  = {Good, I. J.},
  journal = {Journal of the Royal Statistical Society: Series B},
  volume  = {14}, number = {1}, pages = {107--114},
  year    = {1952}
}""",
    "score": """@article{epstein1969scoring,
  title   = {A Scoring System for Probability Forecasts of Ranked Categories},
  author  = {Epstein, Edward S.},
  journal = {Journal of Applied Meteorology},
  volume  = {8}, number = {6}, pages = {985--987},
  year    = {1969}
}""",
    "noul": """@article{brier1950verification,
  title   = {Verification of Forecasts Expressed in Terms of Probability},
  author  = {Brier, Glenn W.},
  journal = {Monthly Weather Review},
  volume  = {78}, number = {1}, pages = {1--3},
  year    = {1950}
}""",
    "regress": """@article{koenker1978regression,
  title   = {Regression Quantiles},
  author  = {Koenker, Roger and Bassett, Gilbert},
  journal = {Econometrica},
  volume  = {46}, number = {1}, pages = {33--50},
  year    = {1978}
}""",
    "trl": """@software{vonwerra2020trl,
  title  = {TRL: Transformers Reinforcement Learning},
  author = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and
            Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallou{\\'e}dec, Quentin},
  url    = {https://github.com/huggingface/trl},
  year   = {2020}
}""",
}


METRICS = {  # table column -> (model-index metric type, readable name)
    "return": ("mean_reward", "mean return (greedy policy)"),
    "normalized_score": ("normalized_score", "normalised score (random 0, oracle 1)"),
    "expected_score": ("expected_score", "normalised score from exact expected rewards"),
    "regret": ("regret", "regret per decision"),
    "goal_share": ("goal_share", "share of episodes that reach the goal"),
    **{f"skill/{q}": (f"skill_{q}", f"report skill ({q})") for q in ("choice", "score", "noul", "regress")},
}
COLUMNS = {"return": "policy", "random": "random", "oracle": "oracle", "normalized_score": "norm.score"}
COLUMNS |= {
    "expected_score": "exp.score",
    "regret": "regret",
    "goal_share": "goal",
    **{k: k for k in list(METRICS)[5:]},
}
RULES = {"choice": "log score", "score": "ranked probability score", "noul": "Brier score", "regress": "pinball loss"}
INTRO = (
    "An `alea_trl` model: a decoder that reads an environment's state once and answers every question about it (the "
    "action and calibrated forecasts) in one forward pass, through small heads on its hidden states, without "
    "generating text."
)
OUTCOME_VALUES = {
    "rtg": "their reward-to-go against a per-env, per-step baseline",
    "branch": "Monte Carlo branching: each sampled action is played to the end in a copy of the env (VinePPO)",
    "episode": "the episode return against the env's recent returns",
}
# fields that are not training choices (paths, logging, derived by __post_init__) or must never be published
_NOT_SHOWN = {"output_dir", "logging_dir", "run_name", "report_to", "resume_from_checkpoint", "disable_tqdm", "debug"}
_NOT_SHOWN |= {"generation_batch_size", "steps_per_generation", "activation_checkpointing", "dataloader_pin_memory"}
_NOT_SHOWN |= {"pad_to_multiple_of", "accelerator_config"}


def is_hub_id(name: str | None) -> bool:
    """Whether ``name`` reads as a Hub repo id rather than a local path."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not name or os.path.exists(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _link(name: str) -> str:
    return f"[{name}](https://huggingface.co/{name})" if is_hub_id(name) else f"`{name}`"


def describe_base(config) -> tuple[str | None, str]:
    """``(Hub id for the base_model metadata or None, sentences)`` from an ``AleaConfig`` of the trained model: where
    it started, and the backbone's architecture."""
    start, backbone = config._name_or_path, config.backbone_name_or_path
    text_config = config.get_text_config()
    shape = describe_backbone(text_config, backbone)
    if start:
        lineage = f" (its backbone: {_link(backbone)})" if backbone and backbone != start else ""
        return (start if is_hub_id(start) else None), (
            f"It was fine-tuned from the Alea model {_link(start)}{lineage}. {shape}"
        )
    if backbone:
        sentence = (
            f"It was fine-tuned from {_link(backbone)}: that decoder, with new answer heads on its hidden states. "
            f"{shape}"
        )
        return (backbone if is_hub_id(backbone) else None), sentence
    built = f" built from the config of {_link(text_config._name_or_path)}" if text_config._name_or_path else ""
    return (
        None,
        f"It was trained from scratch: a {text_config.model_type} decoder{built} with random weights, plus heads. "
        f"{shape}",
    )


def describe_backbone(text_config, backbone: str | None = None) -> str:
    """The backbone's architecture in one sentence; when it kept only the first layers of a local pretrained
    decoder (``num_hidden_layers`` given at load), how many of how many."""
    layers = getattr(text_config, "num_hidden_layers", None)
    of = ""
    if backbone and os.path.isfile(os.path.join(backbone, "config.json")):
        with open(os.path.join(backbone, "config.json")) as f:
            full = json.load(f).get("num_hidden_layers")
        if layers is not None and full is not None and full != layers:
            of = f" (the first {layers} of the pretrained model's {full})"
    parts = [f"{layers} layers{of}" if layers is not None else None]
    parts += [f"{name} {getattr(text_config, key):,}" for key, name in (("hidden_size", "hidden size"), ("vocab_size",
              "vocabulary")) if getattr(text_config, key, None) is not None]  # fmt: skip
    return f"Backbone: a {text_config.model_type} decoder, " + ", ".join(p for p in parts if p) + "."


def _env_kwargs(factory) -> dict:
    return dict(factory.kwargs) if isinstance(factory, RegisteredEnvFactory) else {}


def quick_start(repo: str, env_factories: dict, lora: bool) -> str:
    """Install line and a Python snippet that loads the model and answers one decision of a trained env."""
    builtin = [n for n, f in env_factories.items() if isinstance(f, RegisteredEnvFactory) and n in BUILTIN_ENVS]
    name = builtin[0] if builtin else next(iter(env_factories), "kelly")
    kwargs = "".join(f", {k}={json.dumps(v)}" for k, v in _env_kwargs(env_factories[name]).items())
    note = "" if builtin else f"# register your env first: alea_trl.envs.register_env({name!r}, YourEnv)\n"
    merge = "\nmodel = model.merge_and_unload()  # a LoRA adapter: merged, a plain AleaModel" if lora else ""
    return f"""```bash
pip install alea-trl
```

```python
import numpy as np
from transformers import AutoTokenizer

from alea_trl import AleaModel  # importing alea_trl registers the "alea" model type with transformers' Auto classes
from alea_trl.envs import make_env

model = AleaModel.from_pretrained({json.dumps(repo)}){merge}
tokenizer = AutoTokenizer.from_pretrained({json.dumps(repo)})
{note}env = make_env({json.dumps(name)}{kwargs}).reset(np.random.default_rng(0))
decision = env.observe()
answers = model.predict([decision], tokenizer)[0]  # {{qid: probabilities / p_yes / quantiles}}
for question in decision.questions:
    print(question.qid, question.qtype, answers[question.qid])
print("action:", decision.act.options[int(answers["act"].argmax())], "| oracle:", decision.act.options[env.oracle_action()])
```"""


def questions_table(env_factories: dict) -> tuple[str, set[str]]:
    """A markdown table of every env's questions (one decision of a seeded episode), and the qtypes asked."""
    rows, qtypes = ["| env | kind | question | qtype | asks |", "|---|---|---|---|---|"], set()
    for name, factory in env_factories.items():
        env = factory().reset(np.random.default_rng(0))
        for q in env.observe().questions:
            qtypes.add(q.qtype)
            shape = (
                f" ({len(q.options)} options)" if q.qtype == "choice" else f" ({q.n_bins} bins)" if q.n_bins else ""
            )
            text = q.text.replace("|", "\\|").replace("\n", " ")
            rows.append(f"| {name} | {'dense' if env.dense else 'outcome'} | `{q.qid}` | {q.qtype}{shape} | {text} |")
    return "\n".join(rows), qtypes


def evaluation_table(table: dict[str, dict[str, float]]) -> str:
    """The evaluation as a markdown table (``–`` where a figure does not apply; the goal column only when an env
    has a goal)."""
    goals = any("goal_share" in row for row in table.values())
    columns = {c: name for c, name in COLUMNS.items() if c != "goal_share" or goals}
    rows = ["| env | " + " | ".join(columns.values()) + " |", "|---" * (len(columns) + 1) + "|"]
    for env, row in table.items():
        cells = [f"{row[c]:.3f}" if c in row and row[c] == row[c] else "–" for c in columns]
        rows.append(f"| {env} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def eval_results(table: dict, env_factories: dict, settings: dict) -> list[EvalResult]:
    """``model-index`` results: one per env and figure (undefined figures left out)."""
    results = []
    for env, row in table.items():
        kwargs = _env_kwargs(env_factories[env]) if env in env_factories else {}
        for column, (metric_type, metric_name) in METRICS.items():
            if column in row and row[column] == row[column]:
                results.append(
                    EvalResult(
                        task_type="reinforcement-learning",
                        task_name="Reinforcement Learning",
                        dataset_type=env,
                        dataset_name=env,
                        dataset_args={**kwargs, **settings} or None,
                        metric_type=metric_type,
                        metric_name=metric_name,
                        metric_value=round(float(row[column]), 4),
                    )
                )
    return results


def changed_fields(args) -> dict:
    """The training fields of ``args`` that differ from their defaults (no tokens, paths or Hub settings)."""
    out = {}
    for f in dataclasses.fields(args):
        name = f.name
        if name.startswith(("hub_", "push_to_hub", "_")) or "token" in name or name in _NOT_SHOWN:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = getattr(args, name, None)
        value = value.value if isinstance(value, enum.Enum) else value
        if isinstance(value, (bool, int, float, str, list, dict)) and value != default:
            out[name] = value
    return out


def _versions() -> str:
    names = ("alea-trl", "trl", "transformers", "torch", "peft", "datasets")
    found = []
    for name in names:
        try:
            found.append(f"- {name}: {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return "\n".join(found)


def build_model_card(
    *,
    config,
    args,
    env_factories: dict,
    method: str,
    model_name: str,
    repo: str,
    lora: bool = False,
    eval_table: dict | None = None,
    eval_settings: dict | None = None,
    tags=None,
) -> ModelCard:
    """The card of a trained model (see the module docstring).

    Args:
        config (`AleaConfig`): the trained model's config (its base is read from it).
        args: the training config (``AleaEnvGRPOConfig`` or ``AleaSFTConfig``).
        env_factories (`dict`): the envs it was trained on, name -> factory.
        method (`str`): ``"grpo"`` or ``"sft"``.
        model_name (`str`), repo (`str`): the card's title and the id or path the quick start loads.
        lora (`bool`): the output is a LoRA adapter.
        eval_table (`dict`, *optional*), eval_settings (`dict`, *optional*): the last evaluation and its
            ``episodes`` / ``seed``.
        tags (`str` or `list[str]`, *optional*): the user's tags, added to ``alea``, the method, ``trl`` and the envs.
    """
    import yaml

    base_id, base_sentence = describe_base(config)
    user_tags = [tags] if isinstance(tags, str) else list(tags or [])
    all_tags = sorted({*user_tags, "alea", method, "trl", *env_factories})
    settings = {k: v for k, v in (eval_settings or {}).items() if k in ("episodes", "seed")}
    data = ModelCardData(
        base_model=base_id,
        library_name="peft" if lora else "transformers",
        pipeline_tag="reinforcement-learning",
        tags=all_tags,
        model_name=model_name,
        eval_results=eval_results(eval_table, env_factories, settings) if eval_table else None,
    )
    answers, qtypes = questions_table(env_factories)
    envs = ", ".join(f"`{n}`" for n in env_factories)
    rules = "; ".join(f"{q}: {RULES[q]}" for q in sorted(qtypes) if q in RULES)
    if method == "grpo":
        outcome = getattr(args, "outcome_advantage", None)
        how = (
            "Trained with `AleaEnvGRPOTrainer`, a TRL `GRPOTrainer`: GRPO (Shao et al., 2024) over the envs' decision "
            "points. The action is sampled from a head over the legal options, "
            + _update_sentence(args, outcome)
            + f"; report questions are trained against exact oracles with strictly proper scoring rules ({rules})."
        )
    else:
        how = (
            "Trained with `AleaSFTTrainer` on decisions of oracle and random play: the act head imitates the oracle "
            f"(log score) and report questions are trained against exact oracles with strictly proper scoring rules ({rules})."
        )
    if eval_table:
        where = f"{settings.get('episodes', '?')} seeded episodes per env (seed {settings.get('seed', '?')})"
        evaluation = (
            f"Greedy policy on {where}; `policy`, `random` and `oracle` are mean returns of the same episodes. "
            "`norm.score` is (policy - random) / (oracle - random); `exp.score` the same from exact expected rewards "
            "(dense envs, free of outcome noise); `regret` the mean per decision of the best minus the chosen expected reward; "
            "`skill/<qtype>` is 1 - loss / no-skill loss of the report forecasts. "
            "`alea_trl.evaluation.evaluate_policy(model, tokenizer, envs, episodes=..., seed=...)` plays them again.\n\n"
            + evaluation_table(eval_table)
        )
    else:
        evaluation = "No evaluation was run before this card was written (`trainer.evaluate()` adds one)."
    cites = ["grpo"] if method == "grpo" else []
    outcome_envs = any(not f().dense for f in env_factories.values())
    if method == "grpo" and outcome_envs and getattr(args, "outcome_advantage", None) == "branch":
        cites.append("vineppo")
    cites += ["proper", *[q for q in ("choice", "score", "noul", "regress") if q in qtypes], "trl"]
    config_yaml = yaml.safe_dump(changed_fields(args), sort_keys=True).strip()
    content = f"""---
{data.to_yaml()}
---

# {model_name}

{INTRO} {base_sentence}

## Quick start

{quick_start(repo, env_factories, lora)}

## What it answers

Trained on {envs}. Each decision asks the questions below (one decision shown per env); `act` is the action.

{answers}

## Evaluation

{evaluation}

## Training

{how}

Settings that differ from the defaults:

```yaml
{config_yaml}
```

Framework versions:

{_versions()}

## Citations

{chr(10).join(f"```bibtex{chr(10)}{BIBTEX[c]}{chr(10)}```{chr(10)}" for c in cites)}"""
    return ModelCard(content)


def _update_sentence(args, outcome) -> str:
    """What the policy gradient trains on, dense and outcome decisions, with k where a group of k samples is used."""
    value = OUTCOME_VALUES.get(outcome, outcome)
    update = getattr(args, "dense_update", "all_actions_ascent")
    if update == "sampled":
        return (
            f"dense decisions are GRPO groups of {_group_sizes(args)} actions scored by their exact expected rewards, "
            f"outcome decisions are valued by {value}"
        )
    groups = f"are GRPO groups of {_group_sizes(args)} actions " if outcome == "branch" else "are "
    how = "on every legal action's exact expected reward" + {
        "mirror": ", toward the mirror-descent target of E[Q] - beta KL",
        "all_actions_ascent": ", toward the all-actions step made an ascent of E[Q] - beta KL",
    }.get(update, "")
    return f'dense decisions train {how} (`dense_update="{update}"`), outcome decisions {groups}valued by {value}'


def _group_sizes(args) -> str:
    """k as the card states it: ``8``, or ``8 (nim: 16)`` with per-env k."""
    per_env = getattr(args, "num_generations_per_env", None) or {}
    extra = ", ".join(f"{env}: {k}" for env, k in per_env.items())
    return f"{args.num_generations} ({extra})" if extra else str(args.num_generations)


__all__ = [
    "BIBTEX",
    "build_model_card",
    "changed_fields",
    "describe_base",
    "evaluation_table",
    "is_hub_id",
    "quick_start",
]
