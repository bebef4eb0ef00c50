"""alea_trl: train language models to decide and to forecast inside environments, with TRL."""

from transformers import AutoConfig, AutoModel

from .attention import mask_from_segments
from .collate import PackedBatch, collate_segments
from .configuration_alea import AleaConfig
from .losses import bernoulli_brier, choice_loss, crps_loss, pinball_loss
from .modeling_alea import AleaModel, AleaOutput
from .packing import PackedRequest, pack_request
from .questions import ACT_QID, QTYPES, TAUS, Decision, Question, validate_targets
from .trainer import (
    AleaEnvGRPOConfig,
    AleaEnvGRPOTrainer,
    AleaSFTConfig,
    AleaSFTTrainer,
    HubPushError,
    describe_engine,
    end_distributed,
)


AutoConfig.register("alea", AleaConfig, exist_ok=True)
AutoModel.register(AleaConfig, AleaModel, exist_ok=True)

__version__ = "0.1.0"

__all__ = [
    "ACT_QID",
    "QTYPES",
    "TAUS",
    "AleaConfig",
    "AleaEnvGRPOConfig",
    "AleaEnvGRPOTrainer",
    "AleaModel",
    "AleaOutput",
    "AleaSFTConfig",
    "AleaSFTTrainer",
    "Decision",
    "HubPushError",
    "PackedBatch",
    "PackedRequest",
    "Question",
    "bernoulli_brier",
    "choice_loss",
    "collate_segments",
    "crps_loss",
    "describe_engine",
    "end_distributed",
    "mask_from_segments",
    "pack_request",
    "pinball_loss",
    "validate_targets",
]
