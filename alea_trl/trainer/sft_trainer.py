"""AleaSFTTrainer: supervised warm start on a decision dataset, with the same packing and scoring rules as RL.

Its outputs are those of the RL trainer (:mod:`~alea_trl.trainer.outputs.hub`): an Alea model card and pushes that
save locally first; ``evaluate_envs`` plays the greedy evaluation of ``AleaEnvGRPOTrainer.evaluate`` for the card.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from transformers import Trainer, TrainingArguments

from ..collate import collate_segments, pad_token_id
from ..decision_data import decision_from_row
from ..envs.registry import env_factories, list_envs
from ..evaluation import evaluation_sums, table_from_means
from ..packing import pack_request
from ..questions import QTYPES
from .loss import supervised_loss
from .model_setup import apply_train_mode, grouped_optimizer
from .outputs.hub import push_at_init, save_evaluation, save_lora_extras, saved_before_push, write_model_card
from .outputs.metrics import gathered_means


@dataclass
class AleaSFTConfig(TrainingArguments):
    r"""Configuration of [`AleaSFTTrainer`]: [`~transformers.TrainingArguments`] plus the fields below.

    Parameters:
        max_len (`int`, *optional*, defaults to `2048`):
            Most tokens of one packed decision; a longer one raises a `ValueError` naming its env.
        act_w (`float`, *optional*, defaults to `1.0`):
            Weight of the act loss (log score against the act target distribution).
        report_w (`float`, *optional*, defaults to `1.0`):
            Weight of the proper-scoring report loss.
        train_mode (`str`, *optional*, defaults to `"full"`):
            `"heads"`, `"tail"` (last `tail_k` decoder layers + final norm + heads) or `"full"`.
        tail_k (`int`, *optional*, defaults to `8`):
            Decoder layers trained in `tail` mode.
        lr_head (`float`, *optional*, defaults to `1e-4`):
            Learning rate of the heads (`learning_rate` is the backbone's).
        lr_aux (`float`, *optional*, defaults to `1e-4`):
            Learning rate of the input-side extras.
    """

    max_len: int = field(default=2048, metadata={"help": "Most tokens of one packed decision."})
    act_w: float = field(default=1.0, metadata={"help": "Weight of the act loss."})
    report_w: float = field(default=1.0, metadata={"help": "Weight of the proper-scoring report loss."})
    train_mode: str = field(default="full", metadata={"help": "'heads', 'tail' or 'full'."})
    tail_k: int = field(default=8, metadata={"help": "Decoder layers trained in tail mode."})
    lr_head: float = field(default=1e-4, metadata={"help": "Learning rate of the heads."})
    lr_aux: float = field(default=1e-4, metadata={"help": "Learning rate of the input-side extras."})
    learning_rate: float = field(default=2e-5, metadata={"help": "Learning rate of the backbone."})
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Kept False: rows are whole decisions, packed by the trainer's collator."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.train_mode not in ("heads", "tail", "full"):
            raise ValueError(
                f"AleaSFTConfig: field 'train_mode': must be heads, tail or full, got {self.train_mode!r}"
            )


class DecisionCollator:
    """Packs dataset rows into a `PackedBatch` plus their targets."""

    def __init__(self, tokenizer, max_len: int):
        self.tokenizer, self.max_len = tokenizer, max_len
        self.pad_id = pad_token_id(tokenizer)

    def __call__(self, rows: list[dict]) -> dict:
        packed, targets, acts = [], [], []
        for row in rows:
            decision, tgt, act = decision_from_row(row)
            packed.append(
                pack_request(
                    self.tokenizer, decision.state, decision.questions, max_len=self.max_len, env=decision.env
                )
            )
            targets.append(tgt)
            acts.append(torch.as_tensor(act, dtype=torch.float32))
        return {"batch": collate_segments(packed, self.pad_id), "targets": targets, "act_targets": acts}


class AleaSFTTrainer(Trainer):
    """Supervised training of an `AleaModel` on a decision dataset (see `alea_trl.decision_data`).

    What differs from [`~transformers.Trainer`]: rows are decisions packed by a `DecisionCollator`; the loss is
    ``act_w`` x log score of the act head against the act target + ``report_w`` x the proper-scoring report losses;
    parameter groups use ``lr_head`` / ``learning_rate`` / ``lr_aux``; per-qtype losses are logged; the model card
    is Alea's (its envs: the registered ones named in the dataset's ``env`` column, or those of ``evaluate_envs``)
    and ``push_to_hub`` saves locally before any network call.
    """

    def __init__(
        self, model, args: AleaSFTConfig, train_dataset=None, eval_dataset=None, processing_class=None, **kwargs
    ):
        if processing_class is None:
            raise ValueError("AleaSFTTrainer: field 'processing_class': the tokenizer is required")
        model.decision_len_limit(args.max_len)
        apply_train_mode(model, args.train_mode, args.tail_k)
        collator = DecisionCollator(processing_class, args.max_len)
        datasets = {"train_dataset": train_dataset, "eval_dataset": eval_dataset}
        with push_at_init(args):
            super().__init__(model, args, collator, processing_class=processing_class, **datasets, **kwargs)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        names = (
            train_dataset.unique("env") if train_dataset is not None and "env" in train_dataset.column_names else []
        )
        self.env_factories = env_factories([n for n in names if n in list_envs()])

    def evaluate_envs(self, envs, episodes: int | dict[str, int] = 100, seed: int | None = None) -> dict:
        """Play greedy episodes of ``envs`` (names or name -> factory), as ``AleaEnvGRPOTrainer.evaluate`` does, split
        across processes; the table (returned) and its episodes and seed go to the model card.

        Args:
            envs (`list[str]` or `dict[str, Callable]`): the envs, which the model card then lists.
            episodes (`int` or `dict[str, int]`, defaults to 100): episodes per env.
            seed (`int`, *optional*): seed of the episodes (default ``args.seed + 1``).
        """
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        seed = self.args.seed + 1 if seed is None else seed
        self.env_factories = env_factories(envs)
        shard = (self.accelerator.process_index, self.accelerator.num_processes)
        sums = evaluation_sums(
            model.eval(),
            self.processing_class,
            self.env_factories,
            episodes,
            seed,
            max_len=self.args.max_len,
            shard=shard,
        )
        self.last_eval_table = table_from_means(gathered_means(self.accelerator, sums))
        self.last_eval_settings = {"episodes": episodes, "seed": seed, "envs": list(self.env_factories)}
        model.train(was_training)
        return self.last_eval_table

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Trainer's ``save_model``; a LoRA output also gets the Alea ``config.json`` and names its base."""
        output_dir = output_dir or self.args.output_dir
        super().save_model(output_dir, _internal_call)
        save_lora_extras(self, output_dir)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None) -> None:
        """Write the Alea model card to ``output_dir/README.md`` (see
        :func:`~alea_trl.trainer.outputs.hub.write_model_card`)."""
        write_model_card(self, "sft", model_name=model_name, dataset_name=dataset_name, tags=tags)

    def save_evaluation(self, **settings) -> None:
        """Write ``eval_results.json``: the last ``evaluate_envs`` table and how it was played."""
        save_evaluation(self, **settings)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True, **kwargs):
        """Save the final model, tokenizer and card in ``output_dir``, then ``Trainer.push_to_hub``; a Hub that cannot
        be reached or refuses raises :class:`~alea_trl.trainer.outputs.hub.HubPushError`."""
        with saved_before_push(self, model_name=kwargs.get("model_name"), tags=kwargs.get("tags")):
            return super().push_to_hub(commit_message=commit_message, blocking=blocking, **kwargs)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = grouped_optimizer(self)
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        batch = inputs["batch"].to(self.args.device)
        output = model(**batch.model_inputs())
        loss, act_loss, reports = supervised_loss(
            output,
            batch,
            inputs["act_targets"],
            inputs["targets"],
            act_w=self.args.act_w,
            report_w=self.args.report_w,
            taus=self.accelerator.unwrap_model(model).config.taus,
        )
        mode = "train" if model.training else "eval"
        self._metrics[mode]["loss/act"].append(act_loss.item())
        for q in QTYPES:
            if reports[q]:
                self._metrics[mode][f"report/{q}"].append(torch.stack(reports[q]).mean().item())
        return (loss, output) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs: dict, start_time: float | None = None) -> None:
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        for key, values in self._metrics[mode].items():
            if values:
                logs[f"{prefix}{key}"] = sum(values) / len(values)
        self._metrics[mode].clear()
        super().log(logs, start_time)


__all__ = ["AleaSFTConfig", "AleaSFTTrainer", "DecisionCollator"]
