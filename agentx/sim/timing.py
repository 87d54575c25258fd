"""Roofline price of one engine step (per GPU; the TP ranks work in parallel).

    t_step = max(t_mem, t_flop) + t_tp + overhead + layers x per_layer + n_seqs x per_seq (+ drafts)
    under a KV connector: t_step x factor, plus stall_ms on a share stall_fraction of steps;
        one that launches the step's copies on the host (SimpleCPUOffload): max(t_step, launch),
        launch = load_ms_per_kblock x loaded + store_ms_per_kblock x stored blocks / 1,000
    admitting requests beside decodes right after a decode-only step d: + max(0, prep - t_d),
        prep = admit_host_ms + admit_host_us_per_token x the admitted requests' tokens this step
    t_mem  = weight bytes read / (BW x mbu) + KV bytes read / (BW x attn_mbu)
    t_flop = 2 x active params / TP x tokens / (peak x mfu) + attention FLOPs / (peak x attn_mfu)
    t_tp   = 2 all-reduces per layer: latency + ring volume 2 (TP-1)/TP x tokens x hidden x 2 B / NVLink
MoE: a step whose T tokens each route to top_k of E experts reads, per MoE layer, the expected
number of distinct experts E (1 - (1 - k/E)^T); the rest of the parameters are always read.
Attention FLOPs: 4 x layers x q_heads/TP x head_dim x sum over query tokens of their context.
Sparse attention (MiniMax-M3's MSA): each query reads at most `attn_window` tokens of KV, plus a
block selector that scans `index_bytes_per_token` for every context token.
Speculative decoding: the verify pass is the target step over (1 + K) tokens per sequence;
the draft head then runs K sequential passes, each reading its weights and the batch's draft KV.
Served requests first pass the API-server front end (HTTP, chat template, tokenisation before
the engine sees them), a queue shared by all requests (sim/frontend.py); each needs
frontend_ms + frontend_us_per_prompt_token x prompt tokens of its work.
Every constant and its source is documented in docs/simulator.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .profile import Resolved


@dataclass(slots=True)
class Batch:
    window: int = 0  # sparse-attention budget in tokens (0 = dense attention)
    items: list = field(default_factory=list)  # (req, start_token, n_tokens, is_decode)
    num_tokens: int = 0
    num_seqs: int = 0
    num_decode: int = 0
    kv_read_tokens: int = 0  # context tokens whose KV the attention reads
    ctx_tokens: int = 0  # all context tokens (a sparse-attention selector scans them)
    attn_qk: float = 0.0  # sum over query tokens of the context they attend to
    flops: float = 0.0  # filled by StepTiming: per-GPU estimates for vllm:estimated_*_per_gpu
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    preempted: bool = False  # the schedule preempted a request (vLLM `preempted_req_ids`)
    admitted_tokens: int = 0  # tokens of the requests this schedule took from the waiting queue
    after_decode_s: float = 0.0  # the previous step's modelled time, if it was decode-only
    load_blocks: int = 0  # blocks the connector starts loading with this step (its metadata)
    store_blocks: int = 0  # blocks it starts storing

    @property
    def empty(self) -> bool:
        return not self.items

    def add_decode(self, req, start: int, n: int) -> None:
        self.items.append((req, start, n, True))
        self.num_tokens += n
        self.num_seqs += 1
        self.num_decode += 1
        ctx = start + n
        eff = min(ctx, self.window) if self.window else ctx
        self.ctx_tokens += ctx
        self.kv_read_tokens += eff
        self.attn_qk += n * eff

    def add_prefill(self, req, start: int, n: int) -> None:
        self.items.append((req, start, n, False))
        self.num_tokens += n
        self.num_seqs += 1
        ctx = start + n
        self.ctx_tokens += ctx
        w = self.window
        if not w or ctx <= w:
            self.kv_read_tokens += ctx
            self.attn_qk += n * (start + (n + 1) / 2)
        else:
            self.kv_read_tokens += w
            # query at position p (1-based) attends to min(p, w) tokens
            ramp = max(0, w - start)  # queries still below the window
            self.attn_qk += ramp * (start + (ramp + 1) / 2) + (n - ramp) * w


class StepTiming:
    def __init__(self, r: Resolved, spec_k: int = 0, offload: str = "none") -> None:
        hw, m, cal = r.profile.hardware, r.profile.model, r.profile.calibration
        tp = r.tp
        self.tp = tp
        self.k = spec_k
        bw = hw.hbm_tbps * 1e12
        self.w_bw = bw * cal.mbu
        self.kv_bw = bw * cal.attn_mbu
        self.flops = hw.peak_tflops * 1e12 * cal.mfu
        self.attn_flops = hw.peak_tflops * 1e12 * (cal.attn_mfu or cal.mfu)
        self.kv_tok = r.kv_bytes_per_token_rank
        # weights per rank, split into always-read and routed-expert parts
        total = m.params_b * 1e9
        active = m.active_params_b * 1e9
        if m.num_experts and m.moe_layers:
            per_expert = (total - active) / ((m.num_experts - m.top_k) * m.moe_layers)
            self.expert_bytes_layer = per_expert * m.weight_bytes / tp  # one expert of one layer
            self.base_bytes = (total - per_expert * m.num_experts * m.moe_layers) * m.weight_bytes / tp
        else:
            per_expert = 0.0
            self.expert_bytes_layer = 0.0
            self.base_bytes = total * m.weight_bytes / tp
        self.E, self.topk, self.moe_layers = m.num_experts, m.top_k, m.moe_layers
        self.flop_tok = 2 * active / tp
        self.attn_flop = 4 * m.layers * (m.q_heads / tp) * m.head_dim
        self.overhead = cal.step_overhead_ms / 1e3
        self.layer_overhead = m.layers * cal.per_layer_us / 1e6
        self.per_seq = cal.per_seq_overhead_us / 1e6
        self.spec_per_seq = cal.spec_per_seq_us / 1e6 if spec_k else 0.0
        # tensor-parallel all-reduce: 2 per layer
        if tp > 1:
            self.ar_lat = 2 * m.layers * cal.allreduce_us / 1e6
            self.ar_tok = 2 * m.layers * 2 * (tp - 1) / tp * m.hidden * 2 / (hw.nvlink_gbps * 1e9)
        else:
            self.ar_lat = self.ar_tok = 0.0
        # EAGLE3 draft head: one decoder layer (KV like one target layer) + small head, TP-sharded
        self.draft_bytes = m.draft_params_b * 1e9 * m.weight_bytes / tp
        self.draft_kv_tok = self.kv_tok / m.layers
        self.draft_pass = cal.draft_pass_overhead_us / 1e6
        # host->GPU loads of offloaded KV: the connector's effective rate, capped by the PCIe link
        rate = cal.load_gbps(offload) or hw.host_gbps
        self.host_bw = min(rate, hw.host_gbps) * 1e9
        # GPU->host stores (the lazy walk's copies): the measured copy rate where the profile has
        # one, else the link's
        self.store_bw = min(cal.offload_store_gbps.get(offload) or hw.host_gbps, hw.host_gbps) * 1e9
        # host->GPU copies of loads paced by the steps (the walk's mode): the measured copy rate
        copy = cal.offload_load_copy_gbps.get(offload)
        self.copy_bw = min(copy, hw.host_gbps) * 1e9 if copy else self.host_bw
        # the connector's own per-step cost (measured: offload.base.StepCost); stalls are spread
        # evenly (every 1/stall_fraction-th step) so that a run is reproducible
        cost = cal.step_cost(offload)
        self.step_factor, self.stall_share, self.stall_s = cost.factor, cost.stall_fraction, cost.stall_ms / 1e3
        self.launch_load_s, self.launch_store_s = cost.load_ms_per_kblock / 1e6, cost.store_ms_per_kblock / 1e6
        self._stall_due = 0.0
        # host-side preparation of admitted requests (sim_calibration.fit: fit_admit_host)
        self.admit_host = cal.admit_host_ms / 1e3
        self.admit_host_tok = cal.admit_host_us_per_token / 1e6
        self.window = m.attn_window
        self.index_tok = m.index_bytes_per_token / tp if m.attn_window else 0.0
        self.layers = m.layers
        self.frontend_fixed = cal.frontend_ms / 1e3
        self.frontend_tok = cal.frontend_us_per_prompt_token / 1e6

    def new_batch(self) -> Batch:
        return Batch(window=self.window)

    def weight_bytes(self, tokens: int) -> float:
        """Weight bytes one rank reads in a step of `tokens` tokens."""
        if not self.E:
            return self.base_bytes
        touched = self.E * (1.0 - (1.0 - self.topk / self.E) ** tokens)
        return self.base_bytes + touched * self.moe_layers * self.expert_bytes_layer

    def step_seconds(self, b: Batch) -> float:
        w = self.weight_bytes(b.num_tokens)
        kv = b.kv_read_tokens * self.kv_tok + b.ctx_tokens * self.index_tok
        dense, attn = self.flop_tok * b.num_tokens, self.attn_flop * b.attn_qk
        b.flops, b.read_bytes, b.write_bytes = dense + attn, w + kv, b.num_tokens * self.kv_tok
        t_mem = w / self.w_bw + kv / self.kv_bw
        t_flop = dense / self.flops + attn / self.attn_flops
        t = max(t_mem, t_flop) + self.overhead + self.layer_overhead + b.num_seqs * self.per_seq
        t += self.ar_lat + self.ar_tok * b.num_tokens
        if self.k and b.num_decode:
            t += b.num_decode * self.spec_per_seq
            draft_kv = b.kv_read_tokens * self.draft_kv_tok / self.kv_bw
            t += self.k * (self.draft_bytes / self.w_bw + draft_kv + self.draft_pass)
        if self.stall_share or self.step_factor != 1.0:
            t *= self.step_factor
            self._stall_due += self.stall_share
            if self._stall_due >= 1.0:
                self._stall_due -= 1.0
                t += self.stall_s
        if b.load_blocks or b.store_blocks:
            # the connector launches this step's copies on the host after the model (SimpleCPUOffload
            # `get_finished`): hidden behind a step whose GPU time is longer, the step otherwise
            t = max(t, self.launch_load_s * b.load_blocks + self.launch_store_s * b.store_blocks)
        if b.admitted_tokens and b.after_decode_s and b.num_decode:
            # vLLM 0.24 prepares batch k+1 on the host while batch k runs (asynchronous
            # scheduling): a long prefill batch hides a new request's preparation, a decode step
            # (~11 ms at 32 lanes) does not, and the rest delays the step. Measured only where
            # decodes go on beside the admission; a request admitted alone is not charged
            t += max(0.0, self.admit_host + self.admit_host_tok * b.admitted_tokens - b.after_decode_s)
        return t

    def frontend_seconds(self, prompt_tokens: int) -> float:
        """Modelled time from a request's arrival to its submission to the engine: the API
        server's HTTP handling, chat-template rendering and tokenisation (vLLM does these in
        its front-end process before the engine core sees the request)."""
        return self.frontend_fixed + self.frontend_tok * prompt_tokens

    def load_seconds(self, tokens: int) -> float:
        """Host->GPU copy of `tokens` tokens of KV: each rank loads its share in parallel; the
        engine serialises loads on the link (one copy stream per GPU)."""
        return tokens * self.kv_tok / self.host_bw

    def copy_seconds(self, tokens: int) -> float:
        """Host->GPU copy of `tokens` tokens of KV at the measured copy rate (loads paced by the
        engine's steps, sim/sched.py)."""
        return tokens * self.kv_tok / self.copy_bw

    def store_seconds(self, tokens: int) -> float:
        """GPU->host copy of `tokens` tokens of KV on the store stream (each rank its share)."""
        return tokens * self.kv_tok / self.store_bw
