"""What Alea adds to the model card TRL writes: the tags of the trained envs and the last evaluation table."""

from __future__ import annotations

import os

from ..evaluation import format_table


EVALUATION_NOTE = (
    "Greedy policy, paired episodes; normalised score is (policy - random) / (oracle - random), exp.score the same "
    "from exact expected rewards (dense envs), skill is 1 - loss / no-skill loss."
)


def card_tags(tags, env_names) -> list[str]:
    """The user's tags (one string or a list) followed by ``alea`` and the env names."""
    tags = [tags] if isinstance(tags, str) else list(tags or [])
    return tags + ["alea", *env_names]


def append_evaluation(output_dir: str, table: dict[str, dict[str, float]] | None) -> None:
    """Append the evaluation table to ``output_dir/README.md`` (the card TRL wrote), if both exist."""
    path = os.path.join(output_dir, "README.md")
    if table and os.path.exists(path):
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"\n## Evaluation\n\n{EVALUATION_NOTE}\n\n```\n{format_table(table)}\n```\n")


__all__ = ["append_evaluation", "card_tags"]
