"""What the trainer exposes for benchmarks and users: the loss forwards' token counts, gathered means, and
``evaluate()`` with its own seed and per-env episode counts."""

import pytest
import torch

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.evaluation import evaluation_sums, table_from_means
from alea_trl.trainer.outputs.metrics import gathered_means

from .conftest import TOY_FACTORIES


@pytest.mark.parametrize("counted", ["no", "all"])
def test_token_metrics_count_the_loss_forwards(tiny_model, tokenizer, make_args, counted):
    args = make_args(
        envs=["named_best", "three_in_a_row"],
        max_steps=3,
        pack_rows=False,  # one decision per row: the padded size is rows x longest, easy to recompute
        include_num_input_tokens_seen=counted,
    )
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    steps = []  # per step: (real tokens, padded tokens, decisions) of the loss forwards

    def recorded(packed, batch):
        if torch.is_grad_enabled():
            steps.append((sum(len(p) for p in packed), batch.input_ids.numel(), len(packed)))

    trainer.policy_forward.add_collate_hook(recorded)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "tokens/per_decision" in h]
    assert len(logs) == len(steps) == 3
    for log, (real, padded, n) in zip(logs, steps):
        assert log["tokens/per_decision"] == pytest.approx(real / n)
        assert log["tokens/padding_fraction"] == pytest.approx(1 - real / padded)
    want = sum(padded if counted == "all" else real for real, padded, _ in steps)
    assert trainer.state.num_input_tokens_seen == want
    assert logs[-1]["num_tokens"] == want


def test_evaluate_takes_a_seed_and_per_env_episode_counts(tiny_model, tokenizer, make_args):
    args = make_args(envs=["named_best", "three_in_a_row"], max_steps=1)
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.train()
    episodes = {"named_best": 3, "three_in_a_row": 5}
    metrics = trainer.evaluate(episodes=episodes, seed=11)
    assert model.training  # evaluation runs in eval mode and restores the mode it found
    model.eval()
    sums = evaluation_sums(model, tokenizer, TOY_FACTORIES, episodes=episodes, seed=11, max_len=args.max_len)
    table = table_from_means(gathered_means(trainer.accelerator, sums))
    assert trainer.last_eval_table == table
    assert metrics["eval_three_in_a_row/oracle"] == table["three_in_a_row"]["oracle"]
    other = trainer.evaluate(episodes=episodes, seed=12)
    assert other != metrics  # another seed plays other episodes
    assert trainer.evaluate(episodes=episodes, seed=11) == metrics
