#!/usr/bin/env python3
"""The MLM training curve of nopad against Hugging Face transformers (issue 24's acceptance test:
"300 steps of MLM on a real text corpus ... the loss curves agree, final loss within 2%").

nopad trains and logs every batch it trains on (`nopad train --log FILE --log-batches`: the
packed ids after masking, cu_seqlens, the masked positions and their labels) and every step's
loss. This script trains HF `BertForMaskedLM` in float32 from the same initial folder on the same
batches — padded, with an attention mask, labels -100 everywhere but the masked positions, so
the loss is the mean over the masked tokens as nopad's is — with the same optimiser
(torch.optim.AdamW, no decay on biases and LayerNorm weights), the same clipping
(clip_grad_norm_) and the same schedule (get_linear_schedule_with_warmup), their parameters read
from the trainer_state.json nopad saved. Dropout is 0 in the model's config on both sides.

Writes a JSON of both curves (every step: loss, learning rate, gradient norm), prints the table
of steps 1, 50, 100, ... and the last, and exits 1 when the last step's losses differ by more
than --tolerance (relative; default 0.02).

    scripts/run_train_curve.sh runs the whole check (the model, nopad, this script).

usage: train_curve_hf.py --model DIR --log nopad.jsonl --state DIR/trainer_state.json --out curve.json
"""
import argparse
import bisect
import json
import sys
import time

import torch
from transformers import BertForMaskedLM, get_linear_schedule_with_warmup


def padded_batch(row: dict):
    """The packed batch of a log line as HF wants it: [B, S] ids, types, mask and labels."""
    cu, ids = row["cu_seqlens"], row["input_ids"]
    types = row.get("token_type_ids") or [0] * len(ids)
    n = len(cu) - 1
    longest = max(cu[i + 1] - cu[i] for i in range(n))
    input_ids = torch.zeros(n, longest, dtype=torch.long)  # [PAD] = 0, masked out anyway
    token_types = torch.zeros(n, longest, dtype=torch.long)
    mask = torch.zeros(n, longest, dtype=torch.long)
    labels = torch.full((n, longest), -100, dtype=torch.long)
    for s in range(n):
        a, b = cu[s], cu[s + 1]
        input_ids[s, :b - a] = torch.tensor(ids[a:b])
        token_types[s, :b - a] = torch.tensor(types[a:b])
        mask[s, :b - a] = 1
    for p, label in zip(row["mlm_positions"], row["mlm_labels"]):
        s = bisect.bisect_right(cu, p) - 1
        labels[s, p - cu[s]] = label
    return input_ids, token_types, mask, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the initial model folder both sides start from")
    ap.add_argument("--log", required=True, help="nopad train --log FILE --log-batches")
    ap.add_argument("--state", required=True, help="the trainer_state.json nopad saved")
    ap.add_argument("--out", required=True, help="JSON of both curves")
    ap.add_argument("--inputs", help="make_train_curve_model.py's SHA-256 line, recorded")
    ap.add_argument("--flags", default="", help="nopad train's flags, recorded")
    ap.add_argument("--fixture", help="also write HF's curve for tests/cli_train_curve.sh here")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    rows = [json.loads(line) for line in open(args.log)]
    state = json.load(open(args.state))
    opt_cfg, sched_cfg = state["optimizer"], state["schedule"]
    if opt_cfg["name"] != "adamw" or sched_cfg["kind"] != "linear":
        sys.exit("this replay does AdamW with the linear schedule, not %s / %s"
                 % (opt_cfg["name"], sched_cfg["kind"]))

    model, info = BertForMaskedLM.from_pretrained(args.model, dtype=torch.float32,
                                                  output_loading_info=True)
    missing = [k for k in info["missing_keys"] if k != "cls.predictions.decoder.weight"]
    if missing or info["unexpected_keys"]:
        sys.exit("loading %s: missing %s, unexpected %s" % (args.model, missing, info["unexpected_keys"]))
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    model.train()  # dropout is 0 in the config: train and eval compute the same

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if "bias" in name or "LayerNorm" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": opt_cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=sched_cfg["lr"], betas=(opt_cfg["beta1"], opt_cfg["beta2"]),
                            eps=opt_cfg["eps"])
    sched = get_linear_schedule_with_warmup(opt, sched_cfg["warmup_steps"], sched_cfg["total_steps"])
    params = [p for group in opt.param_groups for p in group["params"]]

    steps = []
    start = time.time()
    for row in rows:
        input_ids, token_types, mask, labels = padded_batch(row)
        lr = sched.get_last_lr()[0]
        out = model(input_ids=input_ids, token_type_ids=token_types, attention_mask=mask, labels=labels)
        out.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, opt_cfg["max_grad_norm"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        steps.append({"step": row["step"], "nopad_loss": row["loss"], "hf_loss": out.loss.item(),
                      "nopad_lr": row["lr"], "hf_lr": lr, "nopad_grad_norm": row["grad_norm"],
                      "hf_grad_norm": norm.item(), "tokens": row["tokens"],
                      "masked": len(row["mlm_positions"])})
        if row["step"] % 50 == 0:
            print("  step %d: nopad %.4f, HF %.4f (%.0f s)" % (row["step"], row["loss"],
                                                           out.loss.item(), time.time() - start),
                  file=sys.stderr)
        if abs(lr - row["lr"]) > 1e-6 * max(lr, 1e-12) + 1e-12:
            sys.exit("step %d: learning rate %.9g in HF, %.9g in nopad: not the same schedule"
                     % (row["step"], lr, row["lr"]))

    last = steps[-1]
    rel = abs(last["nopad_loss"] - last["hf_loss"]) / last["hf_loss"]
    tail = steps[-10:]
    tail_rel = abs(sum(s["nopad_loss"] for s in tail) - sum(s["hf_loss"] for s in tail)) / sum(
        s["hf_loss"] for s in tail)
    worst = max(abs(s["nopad_loss"] - s["hf_loss"]) / s["hf_loss"] for s in steps)
    inputs = json.load(open(args.inputs)) if args.inputs else {}
    result = {
        "inputs": inputs, "flags": args.flags.split(),
        "what": "nopad CPU float32 vs HF BertForMaskedLM float32 (transformers %s, torch %s), MLM on "
                "the same batches and masks" % (__import__("transformers").__version__, torch.__version__),
        "model": args.model, "optimizer": opt_cfg, "schedule": sched_cfg, "data": state["data"],
        "final_relative_difference": rel, "last10_mean_relative_difference": tail_rel,
        "worst_step_relative_difference": worst, "steps": steps,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")

    if args.fixture:
        fixture = {
            "what": "HF BertForMaskedLM float32 on the batches nopad logs with these flags "
                    "(scripts/run_train_curve.sh; tests/cli_train_curve.sh checks nopad against it)",
            "inputs": inputs, "flags": args.flags.split(), "steps": len(steps),
            "hf_loss": [s["hf_loss"] for s in steps], "hf_lr": [s["hf_lr"] for s in steps],
            "nopad_loss_when_made": [s["nopad_loss"] for s in steps],
        }
        with open(args.fixture, "w") as f:
            json.dump(fixture, f, indent=1)
            f.write("\n")

    print("| step | nopad loss | HF loss | relative difference |")
    print("| ---: | ---: | ---: | ---: |")
    shown = [s for s in steps if s["step"] == 1 or s["step"] % 50 == 0 or s is last]
    for s in shown:
        print("| %d | %.4f | %.4f | %.1e |" % (s["step"], s["nopad_loss"], s["hf_loss"],
                                                abs(s["nopad_loss"] - s["hf_loss"]) / s["hf_loss"]))
    print("final loss: nopad %.4f, HF %.4f, relative difference %.2e (bound %g); mean of the last "
          "10 steps %.2e; worst step %.2e" % (last["nopad_loss"], last["hf_loss"], rel,
                                              args.tolerance, tail_rel, worst))
    sys.exit(0 if rel <= args.tolerance else 1)


if __name__ == "__main__":
    main()
