"""The same number of forwards on every process when the model is sharded (DeepSpeed ZeRO-3, FSDP).

A sharded module gathers its parameters with a collective in every forward, so a process that runs one forward more
than the others waits for them forever. Each process has its own episodes: the number of rollout waves, of branch
continuations, of length-grouped loss forwards and of evaluation forwards differs between processes.

Design decisions:
1. **A known count is padded.** The loss forward knows its number of length-grouped forwards before running any:
   the processes agree on the largest count (one all-reduce) and each runs the difference as dummy forwards, whose
   outputs join the loss with weight 0 so that the backward passes match too.
2. **An unknown count is kept in step.** Rollouts, branch continuations and ``evaluate()`` run inside a
   :meth:`EvenForwards.region`. There, every forward of a registered module (the policy, the reference) first asks
   the others which module runs next: an all-reduce (max) of the module ids the processes are about to run, from a
   forward pre-hook that runs before the engine's own hooks. The processes that wanted the chosen module run their
   forward; the others run a dummy forward of it and ask again (one process may be in a rollout wave, whose policy
   forward is followed by the reference's, while another is in a branch continuation of the policy alone). A
   process that has left the region's work asks with id 0, so it only runs dummy forwards, and the region ends when
   every process asks with 0.
3. Regions do not nest: a region entered inside another is part of it, so every process leaves at the same point.
4. The dummy decision is a real one (an env's first decision, packed at set-up), so a dummy forward goes through
   every module a real one does.
5. Unsharded runs (one process, DDP, ZeRO-1/2) run no collective in a forward: nothing is exchanged or padded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from ...collate import collate_segments
from ...packing import PackedRequest


class EvenForwards:
    """Keeps the forwards of sharded modules in step across processes (see the module docstring).

    Args:
        enabled (`bool`): whether the model is sharded (else every method is a no-op).
        device (`torch.device`): where the collectives' tensors and the dummy batch go.
        dummy (`PackedRequest`, *optional*): the decision a dummy forward answers (needed when enabled).
        pad_id (`int`): the padding token of the dummy batch.
    """

    def __init__(self, enabled: bool, device, dummy: PackedRequest | None, pad_id: int):
        self.enabled = enabled and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.device, self.dummy, self.pad_id = device, dummy, pad_id
        self.modules: dict[int, torch.nn.Module] = {}
        self.dummy_forwards = 0  # counted for the tests and the logs
        self._depth, self._in_dummy = 0, False

    @property
    def in_region(self) -> bool:
        return self._depth > 0

    def dummy_inputs(self) -> dict:
        """The model inputs of the dummy decision, on the device."""
        return collate_segments([self.dummy], self.pad_id).to(self.device).model_inputs()

    # ------------------------------------------------------------------------------------------ known counts
    def largest(self, count: int) -> int:
        """The largest ``count`` over the processes (``count`` itself when disabled or inside a region, where
        forwards are kept in step one by one)."""
        if not self.enabled or self.in_region:
            return count
        t = torch.tensor([count], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    # ---------------------------------------------------------------------------------------- unknown counts
    @contextlib.contextmanager
    def region(self, modules: dict[int, torch.nn.Module]):
        """Keep the forwards of ``modules`` (``{id >= 1: module}``, the same ids on every process) in step until every
        process has left the block."""
        if not self.enabled or self.in_region:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        handles = [
            m.register_forward_pre_hook(self._announcer(module_id), prepend=True) for module_id, m in modules.items()
        ]
        self.modules, self._depth = modules, 1
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            self._depth = 0
            self._drain()

    def _announcer(self, module_id: int) -> Callable:
        def announce(module, args):
            if self._in_dummy:
                return
            while (chosen := self._exchange(module_id)) != module_id:  # another process runs another module first
                self.run_dummy(self.modules[chosen])

        return announce

    def _exchange(self, module_id: int) -> int:
        t = torch.tensor([module_id], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _drain(self) -> None:
        """Answer the others' forwards with dummy ones until every process has left the region."""
        while (module_id := self._exchange(0)) != 0:
            self.run_dummy(self.modules[module_id])

    def run_dummy(self, module: torch.nn.Module, grad: bool = False):
        """One forward of ``module`` on the dummy decision (its output, with autograd when ``grad``)."""
        self._in_dummy = True
        self.dummy_forwards += 1
        try:
            with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
                return module(**self.dummy_inputs())
        finally:
            self._in_dummy = False


def first_decision(observer, factories: dict, seed: int = 0) -> PackedRequest:
    """The first decision of the first env whose first decision packs: the dummy decision of :class:`EvenForwards`."""
    errors = []
    for name, factory in factories.items():
        env = factory()
        env.reset(np.random.default_rng(seed))
        where, value, _ = observer.prepare(env, name)
        if where is None:
            return value[0]
        errors.append(f"{name}: {value}")
    raise ValueError(f"no env's first decision packs, so no dummy forward can be built: {'; '.join(errors)}")


def even_forwards_for(sharded: bool, device, observer, pad_id: int, factories: dict) -> EvenForwards:
    """An :class:`EvenForwards` for a run: active when the model is sharded over several processes."""
    even = EvenForwards(sharded, device, None, pad_id)
    if even.enabled:
        even.dummy = first_decision(observer, factories)
    return even


def zero_weight(output) -> torch.Tensor:
    """0 times every floating output of a dummy forward: added to the loss, it makes the backward pass through the
    dummy forward's graph (and its collectives) without changing a gradient."""
    tensors = [v for v in output.values() if torch.is_tensor(v) and v.is_floating_point() and v.requires_grad]
    return sum(t.sum() * 0.0 for t in tensors) if tensors else None


__all__ = ["EvenForwards", "even_forwards_for", "first_decision", "zero_weight"]
