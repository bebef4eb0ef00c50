"""A checkpoint written by an earlier layout of the package resumes: its pickled episode pool names classes by the
module paths they had then (``tests/fixtures/old_checkpoint/WRITTEN_BY`` gives the commit), and the resumed run ends
where an uninterrupted run of today's code ends."""

import importlib.util
import shutil
from pathlib import Path

import torch

from alea_trl import AleaEnvGRPOTrainer


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _fixture_run():
    spec = importlib.util.spec_from_file_location("make_old_checkpoint", FIXTURES / "make_old_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.old_checkpoint_run


def test_a_checkpoint_of_the_earlier_layout_resumes_to_the_uninterrupted_run(tmp_path):
    run = _fixture_run()
    model, args, tokenizer = run(str(tmp_path / "whole"), save_strategy="no")
    whole = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    whole.train()

    resumed_dir = tmp_path / "resumed"
    shutil.copytree(FIXTURES / "old_checkpoint", resumed_dir / "checkpoint-2")
    model, args, tokenizer = run(str(resumed_dir), save_strategy="no")
    resumed = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    resumed.train(resume_from_checkpoint=True)

    assert resumed.state.global_step == whole.state.global_step == 4
    pool = resumed.rollout.pool
    assert set(pool.env_names) == {"kelly", "hmm", "nim"} and all(eps for eps in pool.episodes.values())
    a = whole.accelerator.unwrap_model(whole.model).state_dict()
    b = resumed.accelerator.unwrap_model(resumed.model).state_dict()
    assert a.keys() == b.keys()
    for (
        name
    ) in a:  # equal to the bit on the machine that wrote the fixture; BLAS may differ in the last bits elsewhere
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)
