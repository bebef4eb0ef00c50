"""The device side of a step: decisions answered by the policy (and the reference), in length-grouped forwards, with
as many forwards on every process when the model is sharded."""

from .even import EvenForwards, even_forwards_for
from .policy import ForwardResult, PolicyForward, chunked_forward, length_groups, merge_outputs
from .reference import first_shared_layer, is_peft_model, reference_policy


__all__ = [
    "EvenForwards",
    "ForwardResult",
    "PolicyForward",
    "chunked_forward",
    "even_forwards_for",
    "first_shared_layer",
    "is_peft_model",
    "length_groups",
    "merge_outputs",
    "reference_policy",
]
