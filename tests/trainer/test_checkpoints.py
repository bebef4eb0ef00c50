"""LoRA mode, saving, reloading and resuming."""

import copy
import pickle

import pytest
import torch
from peft import PeftModel
from transformers import AutoModel

from alea_trl import AleaEnvGRPOTrainer, AleaModel

from ..conftest import assert_reloads_identically
from .test_modeling_helpers import fresh_decisions


def _answers(model, tokenizer, decisions):
    return model.predict(decisions, tokenizer)


def _assert_same(a, b):
    for x, y in zip(a, b):
        for qid in x:
            torch.testing.assert_close(torch.as_tensor(x[qid]), torch.as_tensor(y[qid]), atol=0, rtol=0)


def test_lora_reference_is_the_initial_policy_and_only_adapters_and_heads_train(
    tiny_model, tokenizer, make_args, tmp_path
):
    model = tiny_model()
    init = copy.deepcopy(model)
    args = make_args(envs=["kelly", "hmm"], train_mode="lora", tail_k=1, learning_rate=1e-2, lr_head=1e-2, beta=0.1)
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer)
    peft_model = trainer.model
    assert isinstance(peft_model, PeftModel)
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    trainer.train()
    decisions = fresh_decisions(["kelly", "hmm"], 4)
    trained = _answers(peft_model, tokenizer, decisions)
    with peft_model.disable_adapter():  # the reference policy
        _assert_same(_answers(peft_model, tokenizer, decisions), _answers(init, tokenizer, decisions))
    for name, p in peft_model.named_parameters():
        changed = not torch.equal(p, before[name])
        adapter_or_head = "lora_" in name or "modules_to_save" in name
        assert changed == adapter_or_head, name
    assert any("layers.1" in n and "lora_" in n for n in before) and not any(
        "layers.0" in n and "lora_" in n for n in before
    )
    trainer.save_model(str(tmp_path / "adapter"))
    reloaded = PeftModel.from_pretrained(copy.deepcopy(init), str(tmp_path / "adapter"))
    _assert_same(_answers(reloaded, tokenizer, decisions), trained)


def test_save_model_reloads_through_auto_model(tiny_model, tokenizer, make_args, tmp_path):
    model = tiny_model()
    trainer = AleaEnvGRPOTrainer(model, args=make_args(envs=["nim"], max_steps=2), processing_class=tokenizer)
    trainer.train()
    out = tmp_path / "final"
    trainer.save_model(str(out))
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    decisions = fresh_decisions(["nim"], 3)
    for loaded in (AleaModel.from_pretrained(out), AutoModel.from_pretrained(out)):
        assert isinstance(loaded, AleaModel)
        assert_reloads_identically(loaded, model, decisions, tokenizer)
    # an Alea checkpoint is itself a valid `model` argument (training continues from it)
    again = AleaEnvGRPOTrainer(str(out), args=make_args(envs=["nim"], max_steps=1), processing_class=tokenizer)
    assert_reloads_identically(again.model, model, decisions, tokenizer)


@pytest.mark.parametrize("outcome_advantage", ["rtg", "branch"])
def test_resume_from_checkpoint_continues_the_same_run(tiny_model, tokenizer, make_args, tmp_path, outcome_advantage):
    def run(out, resume=None):
        args = make_args(
            output_dir=str(out),
            envs=["kelly", "bandit"],
            max_steps=4,
            save_strategy="steps",
            save_steps=2,
            outcome_advantage=outcome_advantage,  # rtg: outcome decisions wait in the checkpoint for their return
        )
        trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    straight = run(tmp_path / "a")
    run(tmp_path / "b")
    with open(tmp_path / "b" / "checkpoint-2" / "alea_pool_rank0.pkl", "rb") as f:
        pool = pickle.load(f)["pool"]
    open_outcome = [ep for ep in pool.episodes["bandit"] if ep.pending]
    if outcome_advantage == "rtg":
        assert open_outcome, "the checkpoint should hold outcome episodes still waiting for their return"
    resumed = run(tmp_path / "b", resume=str(tmp_path / "b" / "checkpoint-2"))
    for (name, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=name)
    losses = [h["loss"] for h in straight.state.log_history if "loss" in h]
    assert losses == [h["loss"] for h in resumed.state.log_history if "loss" in h]


def test_a_checkpoint_saved_mid_buffer_resumes_only_under_the_dense_update_of_its_rows(
    tiny_model, tokenizer, make_args, tmp_path
):
    """With ``num_iterations=2`` checkpoint-1 is saved part way through a buffer of rows that the next step trains
    again. Made under ``"all_actions"`` their dense rows hold advantages; the step-target default would fit them as
    log-prob steps, so that resume is refused (naming the field and the update to resume with), while a resume
    under the rows' own update goes on."""

    def run(dense_update, resume=None):
        args = make_args(
            output_dir=str(tmp_path), envs=["kelly"], max_steps=2, num_iterations=2, save_strategy="steps",
            save_steps=1, dense_update=dense_update, beta=0.0,
        )  # fmt: skip
        trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    run("all_actions")
    checkpoint = str(tmp_path / "checkpoint-1")
    with pytest.raises(ValueError, match="field 'dense_update'.*made under dense_update='all_actions'"):
        run("all_actions_ascent", resume=checkpoint)
    assert run("all_actions", resume=checkpoint).state.global_step == 2
