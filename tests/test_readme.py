"""The custom-env example of docs/your_environment.md runs as written, obeys the env contract, and trains."""

import re
from pathlib import Path

import numpy as np

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.envs import make_env
from alea_trl.questions import validate_action_rewards, validate_targets


PAGE = Path(__file__).resolve().parents[1] / "docs" / "your_environment.md"


def _custom_env_example() -> str:
    text = PAGE.read_text()
    section = text[text.index("# Your own environment") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_custom_env_example(tiny_model_factory, tokenizer, tmp_path):
    namespace: dict = {}
    exec(compile(_custom_env_example(), str(PAGE), "exec"), namespace)
    env = make_env("dice")
    for seed in range(20):
        env.reset(np.random.default_rng(seed))
        while not env.done:
            d = env.observe()
            validate_targets(d, env.oracle_targets())
            rewards = validate_action_rewards(d, env.action_rewards())
            assert env.oracle_action() == int(np.argmax(rewards))
            env.step(env.oracle_action())
    args = namespace["args"]
    args.output_dir, args.max_steps, args.use_cpu, args.bf16 = str(tmp_path), 2, True, False
    args.report_to, args.save_strategy, args.eps_per_env, args.per_device_train_batch_size = [], "no", 2, 4
    args.max_batch, args.train_mode, args.gradient_checkpointing = 8, "full", False
    trainer = AleaEnvGRPOTrainer(tiny_model_factory(), args=args, processing_class=tokenizer)
    trainer.train()
    assert any("env/dice/regret" in h for h in trainer.state.log_history)
