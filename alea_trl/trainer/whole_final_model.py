"""The final model of an FSDP run with sharded state dicts, saved whole.

Design decisions:
1. ``fsdp_state_dict_type: SHARDED_STATE_DICT`` makes checkpoints fast and small per process, and a run resumes
   from them; but ``Trainer.save_model`` then writes no weights at all, so the output directory of a finished run
   held no model. The final save (any ``save_model`` call that is not a checkpoint's) gathers the full state dict
   instead, as ``FULL_STATE_DICT`` would, so ``AleaModel.from_pretrained(output_dir)`` loads it.
2. Checkpoints keep the sharded format the config asked for.
"""

from __future__ import annotations

import contextlib

from torch.distributed.fsdp import StateDictType


@contextlib.contextmanager
def _full_state_dict(plugin):
    saved = plugin.state_dict_type
    plugin.state_dict_type = StateDictType.FULL_STATE_DICT
    try:
        yield
    finally:
        plugin.state_dict_type = saved


class WholeFinalModel:
    """Mixin of the trainer: the final ``save_model`` of a sharded-state-dict FSDP run writes whole weights."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        if _internal_call or not self.is_fsdp_enabled or "FULL_STATE_DICT" in str(plugin.state_dict_type):
            return super().save_model(output_dir, _internal_call)
        with _full_state_dict(plugin):  # every process takes part in gathering the weights
            return super().save_model(output_dir, _internal_call)


__all__ = ["WholeFinalModel"]
