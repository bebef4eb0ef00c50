"""Crash-safe checkpoints for the Alea trainer: the episode pool travels with each checkpoint, a commit marker is
written last, and resuming picks the newest *complete* checkpoint.

Design decisions:
1. Trainer writes a checkpoint in place; a process killed mid-save leaves a folder with weights but maybe not the
   optimizer, scheduler or pool. The marker ``alea_checkpoint_complete.json`` is written atomically after every rank
   finished, so its presence is the definition of a complete checkpoint.
2. Older checkpoints are rotated out only after the new one is complete, so the newest complete one always survives.
3. Each rank pickles its rollout state (pool, sampler) and TRL's buffer of generated rows with the micro-step counter,
   so a resumed run continues exactly.
"""

from __future__ import annotations

import json
import os
import pickle

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints


POOL_STATE_NAME = "alea_pool_rank{rank}.pkl"
COMPLETE_MARKER = "alea_checkpoint_complete.json"


class CrashSafeCheckpoints:
    """Mixin for a ``GRPOTrainer`` subclass with a ``rollout`` (see :class:`AleaEnvGRPOTrainer`)."""

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint, plus the episode pool of every rank, then a commit marker written last (atomically,
        after all ranks are done). Older checkpoints are rotated out only once the new one is complete, so a process
        killed at any moment leaves its newest *complete* checkpoint on disk."""
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # rotate only once complete (below)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        run_dir = self._get_output_dir(trial=trial)
        output_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(output_dir, exist_ok=True)
        pool_path = os.path.join(output_dir, POOL_STATE_NAME.format(rank=self.accelerator.process_index))
        # the rollout state, and TRL's buffer of generated rows with its micro-step counter (mid-buffer checkpoints
        # happen with num_iterations > 1), so a resumed run continues exactly
        state = {**self.rollout.state_dict(), "buffered_inputs": self._buffered_inputs, "micro_step": self._step}
        _atomic_pickle(state, pool_path)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            _atomic_write(
                os.path.join(output_dir, COMPLETE_MARKER), json.dumps({"global_step": self.state.global_step})
            )
            if limit:
                rotate_checkpoints(
                    output_dir=run_dir,
                    save_total_limit=limit,
                    best_model_checkpoint=self.state.best_model_checkpoint,
                    use_mtime=True,
                )
        self.accelerator.wait_for_everyone()

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Trainer's ``train``; ``resume_from_checkpoint=True`` picks the newest *complete* checkpoint (one whose
        commit marker was written), and a path to an incomplete one is refused."""
        if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() == "true":  # from a CLI / YAML
            resume_from_checkpoint = True
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"resume_from_checkpoint=True: no complete checkpoint in {self.args.output_dir}")
        elif isinstance(resume_from_checkpoint, str) and not os.path.exists(
            os.path.join(resume_from_checkpoint, COMPLETE_MARKER)
        ):
            newest = last_complete_checkpoint(os.path.dirname(resume_from_checkpoint.rstrip("/")) or ".")
            raise ValueError(
                f"field 'resume_from_checkpoint': {resume_from_checkpoint} is incomplete (no {COMPLETE_MARKER}: its "
                f"save was interrupted); the newest complete checkpoint there is {newest}"
            )
        return super().train(
            resume_from_checkpoint=resume_from_checkpoint,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            **kwargs,
        )

    def _load_rng_state(self, checkpoint):
        super()._load_rng_state(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, POOL_STATE_NAME.format(rank=self.accelerator.process_index))
        if os.path.exists(path):
            with open(path, "rb") as f:
                state = pickle.load(f)
            self.rollout.load_state_dict(state)
            self._buffered_inputs, self._step = state.get("buffered_inputs"), state.get("micro_step", 0)


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` folder of ``output_dir`` whose commit marker exists (``None`` if there is none)."""
    if not os.path.isdir(output_dir):
        return None
    found = []
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        prefix = f"{PREFIX_CHECKPOINT_DIR}-"
        if (
            name.startswith(prefix)
            and name[len(prefix) :].isdigit()
            and os.path.exists(os.path.join(path, COMPLETE_MARKER))
        ):
            found.append((int(name[len(prefix) :]), path))
    return max(found)[1] if found else None


def _atomic_write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def _atomic_pickle(obj, path: str) -> None:
    with open(path + ".tmp", "wb") as f:
        pickle.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


__all__ = ["COMPLETE_MARKER", "POOL_STATE_NAME", "CrashSafeCheckpoints", "last_complete_checkpoint"]
