"""Prometheus counters of the simulated engine, under vLLM's metric names.

Counted at the scheduler, before any frontend stop-string trimming, as vLLM
counts them.
"""

from __future__ import annotations

__all__ = ["SimMetrics"]


class SimMetrics:
    """Plain integer counters; rendered as Prometheus text on demand."""

    __slots__ = (
        "accepted_per_position",
        "accepted_tokens",
        "draft_tokens",
        "drafts",
        "engine",
        "generation_tokens",
        "model_name",
        "prompt_tokens",
        "requests_finished",
    )

    def __init__(self, model_name: str, draft_len: int, engine: str = "0") -> None:
        self.model_name = model_name
        self.engine = engine
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_per_position = [0] * draft_len
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.requests_finished = 0

    def render(self) -> str:
        labels = f'engine="{self.engine}",model_name="{self.model_name}"'
        lines: list[str] = []

        def counter(name: str, help_text: str, samples: list[tuple[str, int]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} counter")
            for extra_labels, value in samples:
                lines.append(f"{name}_total{{{labels}{extra_labels}}} {float(value)}")

        counter(
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts (SIMULATED).",
            [("", self.drafts)],
        )
        counter(
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens (SIMULATED).",
            [("", self.draft_tokens)],
        )
        counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens (SIMULATED).",
            [("", self.accepted_tokens)],
        )
        counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position (SIMULATED).",
            [
                (f',position="{index}"', value)
                for index, value in enumerate(self.accepted_per_position)
            ],
        )
        counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed (SIMULATED).",
            [("", self.generation_tokens)],
        )
        counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed (SIMULATED).",
            [("", self.prompt_tokens)],
        )
        counter(
            "vllm:request_success",
            "Count of finished requests (SIMULATED).",
            [("", self.requests_finished)],
        )
        return "\n".join(lines) + "\n"
