"""Crash-safe checkpoints for the Alea trainer: the episode pool travels with each checkpoint, a commit marker is
written last, and resuming picks the newest *complete* checkpoint.

Design decisions:
1. Trainer writes a checkpoint in place; a process killed mid-save leaves a folder with weights but maybe not the
   optimizer, scheduler or pool. The marker ``alea_checkpoint_complete.json`` is written atomically after every rank
   finished, so its presence is the definition of a complete checkpoint.
2. Older checkpoints are rotated out only after the new one is complete, so the newest complete one always survives.
3. Each rank pickles its rollout state (pool, sampler) and TRL's buffer of generated rows with the micro-step counter,
   so a resumed run continues exactly.
4. The pickle names classes by module path; when a module moves, ``MOVED_MODULES`` maps its old path to the new one,
   so checkpoints written before the move still resume.
"""

from __future__ import annotations

import json
import os
import pickle

import torch
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints


POOL_STATE_NAME = "alea_pool_rank{rank}.pkl"
COMPLETE_MARKER = "alea_checkpoint_complete.json"


# modules whose classes a checkpoint's pickled rollout state may name, by the path they had when it was written
# (the rollout state holds the pool with its episodes, and the queue and TRL's buffer with their decision rows)
MOVED_MODULES = {
    "alea_trl.trainer.pool": "alea_trl.trainer.rollout.pool",
    "alea_trl.trainer.loss_inputs": "alea_trl.trainer.rollout.rows",
}


class _RolloutUnpickler(pickle.Unpickler):
    """Unpickles a rollout state written by an earlier layout of the package (``MOVED_MODULES``)."""

    def find_class(self, module, name):
        return super().find_class(MOVED_MODULES.get(module, module), name)


def pool_state_path(checkpoint: str, rank: int) -> str:
    """Where rank ``rank``'s rollout state lives in a checkpoint folder."""
    return os.path.join(checkpoint, POOL_STATE_NAME.format(rank=rank))


def commit_checkpoint(trainer, output_dir: str, run_dir: str, save_total_limit: int | None) -> None:
    """Complete the checkpoint ``Trainer._save_checkpoint`` just wrote in ``output_dir`` (saved with no rotation):
    pickle this rank's rollout state and TRL's buffer of generated rows with its micro-step counter (mid-buffer
    checkpoints happen with ``num_iterations > 1``), then, once every rank is done, write the commit marker and rotate
    older checkpoints out to ``save_total_limit``."""
    os.makedirs(output_dir, exist_ok=True)
    state = {**trainer.rollout.state_dict(), "buffered_inputs": trainer._buffered_inputs, "micro_step": trainer._step}
    state["dense_update"] = trainer.args.dense_update  # what the buffered dense rows hold (advantages or steps)
    _atomic_pickle(state, pool_state_path(output_dir, trainer.accelerator.process_index))
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        _atomic_write(
            os.path.join(output_dir, COMPLETE_MARKER), json.dumps({"global_step": trainer.state.global_step})
        )
        if save_total_limit:
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=save_total_limit,
                best_model_checkpoint=trainer.state.best_model_checkpoint,
                use_mtime=True,
            )
    trainer.accelerator.wait_for_everyone()


def complete_checkpoint(resume_from_checkpoint, output_dir: str):
    """The checkpoint ``train(resume_from_checkpoint=...)`` resumes: ``True`` (or ``"true"`` from a CLI / YAML) picks
    the newest *complete* one of ``output_dir``; a path must be complete (its commit marker written)."""
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() == "true":
        resume_from_checkpoint = True
    if resume_from_checkpoint is True:
        resume_from_checkpoint = last_complete_checkpoint(output_dir)
        if resume_from_checkpoint is None:
            raise ValueError(f"resume_from_checkpoint=True: no complete checkpoint in {output_dir}")
    elif isinstance(resume_from_checkpoint, str) and not os.path.exists(
        os.path.join(resume_from_checkpoint, COMPLETE_MARKER)
    ):
        newest = last_complete_checkpoint(os.path.dirname(resume_from_checkpoint.rstrip("/")) or ".")
        raise ValueError(
            f"field 'resume_from_checkpoint': {resume_from_checkpoint} is incomplete (no {COMPLETE_MARKER}: its "
            f"save was interrupted); the newest complete checkpoint there is {newest}"
        )
    return resume_from_checkpoint


def load_rollout_state(checkpoint: str, rank: int) -> dict | None:
    """Rank ``rank``'s rollout state saved in ``checkpoint`` (``None`` when it has none), classes of moved modules
    remapped (``MOVED_MODULES``)."""
    path = pool_state_path(checkpoint, rank)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return _RolloutUnpickler(f).load()


def saved_dense_update(checkpoint: str) -> str:
    """The ``dense_update`` of the run that saved ``checkpoint``, for checkpoints whose rollout state does not record
    it: from the ``training_args.bin`` Trainer saves beside it (``"all_actions"``, the default of the time, when the
    saved config predates the field or the file is missing)."""
    path = os.path.join(checkpoint, TRAINING_ARGS_NAME)
    if not os.path.exists(path):
        return "all_actions"
    return getattr(torch.load(path, weights_only=False), "dense_update", "all_actions")


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


__all__ = [
    "COMPLETE_MARKER",
    "MOVED_MODULES",
    "POOL_STATE_NAME",
    "commit_checkpoint",
    "complete_checkpoint",
    "last_complete_checkpoint",
    "load_rollout_state",
    "saved_dense_update",
]
