"""Fitting the GPU prior to profiled kernels and timed steps (gnn_ptp/prior_fit.py).

All inputs here are SYNTHETIC: kernel rows and step samples generated from a known prior (curves and host
costs chosen below), so the fit must recover what made them."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace

import pytest
import torch

from gnn_ptp import ops, prior, prior_fit
from gnn_ptp.graph import NODE_FEATURES
from gnn_ptp.hardware import HARDWARE

H200 = HARDWARE["h200"]
TRUE = {"gemm": {"bf16": {"peak_fraction": 0.7, "half_size": 5e9, "slope": 1.0},
                 "fp32": {"peak_fraction": 0.6, "half_size": 5e8, "slope": 1.0}},
        "vector": {"peak_fraction": 0.05},
        "memory": {"peak_fraction": 0.8, "half_size": 2e6, "slope": 1.0},
        "launch_floor_s": 2e-6}


def _synthetic_rows(n: int = 3000, seed: int = 0) -> prior_fit.KernelRows:
    """Kernels whose 'measured' time is the TRUE prior's, times a little log-normal noise."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.randint(0, 3, (n,), generator=g)  # 0 bf16 GEMM, 1 fp32 GEMM, 2 element-wise
    flops = 10 ** (6 + 7 * torch.rand(n, generator=g, dtype=torch.float64))
    moved = torch.where(kind == 2, 10 ** (3 + 7 * torch.rand(n, generator=g, dtype=torch.float64)),
                        flops ** (2 / 3) * 6)
    flops = torch.where(kind == 2, moved / 8, flops)
    dtype = ["bf16" if k == 0 else "fp32" for k in kind.tolist()]
    rows = prior_fit.KernelRows(flops, moved, dtype, kind < 2, kind == 0,
                                ["matmul" if k < 2 else "elementwise" for k in kind.tolist()],
                                ["synthetic"] * n, torch.zeros(n, dtype=torch.float64))
    truth = prior.profile_from_dict(H200, TRUE)
    noise = torch.exp(0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    rows.seconds = prior_fit._prior_seconds(rows, truth) * noise
    return rows


def test_the_device_fit_recovers_the_curves_that_made_the_kernels():
    rows = _synthetic_rows()
    fitted = prior_fit.fit_device(rows, H200, steps=1500)
    profile = prior_fit.device_profile(H200, fitted)
    errors = prior_fit.kernel_errors(rows, profile)
    assert errors["all"]["median_ape"] < 8  # the noise is 5 %
    for dtype, flops in (("bf16", 1e12), ("fp32", 1e11)):
        want = prior.Curve.from_dict(TRUE["gemm"][dtype])(torch.tensor([flops], dtype=torch.float64))
        got = profile.gemm_curve(dtype)(torch.tensor([flops], dtype=torch.float64))
        assert got.item() == pytest.approx(want.item(), rel=0.1)
    big = torch.tensor([1e10], dtype=torch.float64)
    assert profile.memory(big).item() == pytest.approx(prior.Curve.from_dict(TRUE["memory"])(big).item(), rel=0.1)


def test_step_weights_count_every_step_the_same_where_kernel_time_weights_count_the_many_kernels():
    """SYNTHETIC: small steps of 50 tiny fp32 GEMMs each that run 2x faster than the TRUE curve says, beside
    large steps of one large GEMM and 20 tiny ones each at it (the same tiny sizes: no curve fits both).
    Weighted by the square root of their time the large steps' many tiny kernels set the tiny sizes' price
    and the small steps stay priced ~2x; weighted by their share of their own step (``step_weights``) every
    step counts once and the small steps, whose time they are, set it. ``kernel_weights`` sums each step's
    weights to the same."""
    n_small, n_large, tiny_small, tiny_large = 20, 200, 50, 20
    g = torch.Generator().manual_seed(3)

    def tiny(k):
        return 10 ** (5 + torch.rand(k, generator=g, dtype=torch.float64))
    flops, step_of, fast = [], [], []
    for i in range(n_small):
        flops.append(tiny(tiny_small))
        step_of += [i] * tiny_small
        fast += [True] * tiny_small
    for i in range(n_large):
        flops += [10 ** (11 + torch.rand(1, generator=g, dtype=torch.float64)), tiny(tiny_large)]
        step_of += [n_small + i] * (1 + tiny_large)
        fast += [False] * (1 + tiny_large)
    flops, step_of, fast = torch.cat(flops), torch.tensor(step_of), torch.tensor(fast)
    n = flops.numel()
    rows = prior_fit.KernelRows(flops, flops ** (2 / 3) * 6, ["fp32"] * n, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["matmul"] * n, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64))
    truth = prior.profile_from_dict(H200, {**TRUE, "launch_floor_s": 1e-9})
    rows.seconds = prior_fit._prior_seconds(rows, truth) * torch.where(fast, 0.5, 1.0).double()
    totals = torch.zeros(n_small + n_large, dtype=torch.float64).index_add(0, step_of, rows.seconds)
    rows.step_share = rows.seconds / totals[step_of]
    weights = prior_fit.kernel_weights(rows, step_weights=True)
    per_step = torch.zeros(n_small + n_large, dtype=torch.float64).index_add(0, step_of, weights)
    assert torch.allclose(per_step, torch.full_like(per_step, 1 / (n_small + n_large)))
    ratio = {}
    for step_weights in (False, True):
        fitted = prior_fit.fit_device(rows, H200, steps=800, intensity=False, step_weights=step_weights)
        assert fitted.get("step_weights", False) == step_weights
        pred = prior_fit._prior_seconds(rows, prior_fit.device_profile(H200, fitted))
        ratio[step_weights] = float(pred[fast].sum() / rows.seconds[fast].sum())
    assert ratio[False] > 1.5  # the large steps' tiny kernels set the price
    assert ratio[True] < ratio[False] - 0.4  # 1.80 -> 1.20 when written
    with pytest.raises(ValueError, match="step_share"):
        prior_fit.kernel_weights(replace(rows, step_share=None), step_weights=True)


def test_a_non_gemm_category_gets_its_own_peak_fraction_where_its_kernels_run_faster():
    """SYNTHETIC: element-wise kernels at the TRUE vector fraction (0.05), optimizer kernels (foreach,
    compute-heavy per byte) at 0.5: one pooled vector curve cannot price both, one fraction per category
    can; the pooled curve stays the element-wise one, which categories without a fraction use. Each
    category's FLOPs per byte is fixed here, so its own bandwidth fraction could stand in for its compute
    fraction: the bandwidth is pooled to test the compute side alone."""
    g = torch.Generator().manual_seed(3)
    n = 3000
    opt = torch.rand(n, generator=g) < 0.3
    moved = 10 ** (7 + 3 * torch.rand(n, generator=g, dtype=torch.float64))  # the memory curve's plateau
    flops = moved * torch.where(opt, 40.0, 5.0)  # compute-bound in both, at their own fractions
    category = ["optimizer" if o else "elementwise" for o in opt.tolist()]
    rows = prior_fit.KernelRows(flops, moved, ["fp32"] * n, torch.zeros(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), category, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64))
    truth = dataclasses.replace(prior.profile_from_dict(H200, TRUE), vector_fraction={"optimizer": 0.5})
    noise = torch.exp(0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    rows.seconds = prior_fit._prior_seconds(rows, truth) * noise

    fitted = prior_fit.fit_device(rows, H200, steps=1500, intensity=False, memory_by_category=False)
    profile = prior_fit.device_profile(H200, fitted)
    for category, want in (("optimizer", 0.5), ("elementwise", 0.05)):
        for size in (1e9, 3e10):  # the curve where the kernels are (its asymptote trades with its ramp)
            got = profile.vector_curve(category)(torch.tensor([size], dtype=torch.float64)).item()
            assert got == pytest.approx(want, rel=0.15), (category, size)
    assert set(fitted["vector_fraction"]) == {"optimizer", "elementwise"}
    per_category = prior_fit.kernel_errors(rows, prior_fit.device_profile(H200, fitted))
    pooled = prior_fit.kernel_errors(rows, prior_fit.device_profile(
        H200, prior_fit.fit_device(rows, H200, steps=1500, intensity=False, vector_by_category=False,
                                   memory_by_category=False)))
    assert per_category["optimizer"]["median_ape"] < 8 < pooled["optimizer"]["median_ape"]


def test_a_non_gemm_category_and_dtype_gets_its_own_bandwidth_fraction():
    """SYNTHETIC: memory-bound kernels (1 FLOP per 100 bytes) in three streams: fp32 element-wise at the
    TRUE bandwidth fraction (0.8), bf16 element-wise at 0.9 and bf16 optimizer kernels at 0.55, reaching
    half of it only at 20 MB (AdamW's foreach kernels on bf16 states: ~65 % on an H200, one launch per chunk
    of tensors). One pooled memory curve cannot price all three; one fraction and half size per (category,
    dtype) can."""
    g = torch.Generator().manual_seed(5)
    n = 3000
    kind = torch.randint(0, 3, (n,), generator=g)
    moved = 10 ** (7 + 3 * torch.rand(n, generator=g, dtype=torch.float64))  # near the curve's plateau
    category = ["optimizer" if k == 2 else "elementwise" for k in kind.tolist()]
    dtype = ["fp32" if k == 0 else "bf16" for k in kind.tolist()]
    rows = prior_fit.KernelRows(moved / 100, moved, dtype, torch.zeros(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), category, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64))
    own = {"elementwise:bf16": 0.9, "optimizer:bf16": 0.55}
    truth = dataclasses.replace(prior.profile_from_dict(H200, TRUE), memory_fraction=own,
                                memory_half_size={"optimizer:bf16": 2e7})
    noise = torch.exp(0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    rows.seconds = prior_fit._prior_seconds(rows, truth) * noise

    fitted = prior_fit.fit_device(rows, H200, steps=1500, intensity=False)
    assert set(fitted["memory_fraction"]) == {"elementwise:fp32", "elementwise:bf16", "optimizer:bf16"}
    profile = prior_fit.device_profile(H200, fitted)
    big = torch.tensor([1e10], dtype=torch.float64)
    for (category, dtype), want in ((("elementwise", "fp32"), 0.8), (("elementwise", "bf16"), 0.9),
                                    (("optimizer", "bf16"), 0.55)):
        got = profile.memory_curve(category, dtype)(big).item()
        assert got == pytest.approx(want * prior.Curve.from_dict(TRUE["memory"])(big).item() / 0.8, rel=0.1), \
            (category, dtype)
    mid = torch.tensor([2e7], dtype=torch.float64)  # the optimizer's half size: ~half its fraction
    assert profile.memory_curve("optimizer", "bf16")(mid).item() == pytest.approx(0.55 / 2, rel=0.15)
    per_pair = prior_fit.kernel_errors(rows, profile)
    pooled = prior_fit.kernel_errors(rows, prior_fit.device_profile(
        H200, prior_fit.fit_device(rows, H200, steps=1500, intensity=False, memory_by_category=False)))
    assert per_pair["optimizer"]["median_ape"] < 8 < pooled["optimizer"]["median_ape"]


def test_a_category_s_own_fraction_prices_its_nodes_only_and_keeps_old_digests():
    x = torch.zeros(2, NODE_FEATURES)
    x[:, 0] = math.log2(1 + 1e9)  # compute-bound: 1 GFLOP, 1 kB
    x[:, 1] = x[:, 2] = math.log2(1 + 500)
    x_cat = torch.zeros(2, 4, dtype=torch.long)
    x_cat[0, 1], x_cat[1, 1] = ops.CATEGORIES.index("optimizer"), ops.CATEGORIES.index("elementwise")
    x_cat[:, 2] = ops.DTYPE_ID["fp32"]
    plain = prior.profile_from_dict(H200, TRUE)
    own = prior.profile_from_dict(H200, {**TRUE, "vector_fraction": {"optimizer": 0.5}})
    before, after = prior.node_seconds(x, x_cat, plain), prior.node_seconds(x, x_cat, own)
    assert after[0].item() == pytest.approx(before[0].item() * 0.05 / 0.5, rel=1e-6)
    assert after[1].item() == pytest.approx(before[1].item(), rel=1e-12)
    assert "vector_fraction" in prior.OPTIONAL_PREDICTIVE_KEYS  # a section without it keeps its digest


def test_a_pair_s_own_bandwidth_fraction_prices_its_nodes_only_and_keeps_old_digests():
    x = torch.zeros(3, NODE_FEATURES)
    x[:, 0] = math.log2(1 + 1e3)  # memory-bound: 1 kFLOP, 1 GB
    x[:, 1] = x[:, 2] = math.log2(1 + 5e8)
    x_cat = torch.zeros(3, 4, dtype=torch.long)
    x_cat[:2, 1], x_cat[2, 1] = ops.CATEGORIES.index("optimizer"), ops.CATEGORIES.index("elementwise")
    x_cat[0, 2], x_cat[1:, 2] = ops.DTYPE_ID["bf16"], ops.DTYPE_ID["fp32"]
    plain = prior.profile_from_dict(H200, TRUE)
    own = prior.profile_from_dict(H200, {**TRUE, "memory_fraction": {"optimizer:bf16": 0.4}})
    before, after = prior.node_seconds(x, x_cat, plain), prior.node_seconds(x, x_cat, own)
    assert after[0].item() == pytest.approx(before[0].item() * 0.8 / 0.4, rel=1e-6)
    assert after[1:].tolist() == pytest.approx(before[1:].tolist(), rel=1e-12)  # other dtype, other category
    assert "memory_fraction" in prior.OPTIONAL_PREDICTIVE_KEYS


def test_a_streaming_category_is_priced_by_its_bytes_alone_and_is_the_gpu_default():
    x = torch.zeros(2, NODE_FEATURES)
    x[:, 0] = math.log2(1 + 1e12)  # 1 TFLOP over 1 GB: compute-bound at the vector curve's 0.05
    x[:, 1] = x[:, 2] = math.log2(1 + 5e8)
    x_cat = torch.zeros(2, 4, dtype=torch.long)
    x_cat[0, 1], x_cat[1, 1] = ops.CATEGORIES.index("optimizer"), ops.CATEGORIES.index("elementwise")
    x_cat[:, 2] = ops.DTYPE_ID["fp32"]
    plain = prior.profile_from_dict(H200, TRUE)
    streams = prior.profile_from_dict(H200, {**TRUE, "streaming": ["optimizer"]})
    before, after = prior.node_seconds(x, x_cat, plain), prior.node_seconds(x, x_cat, streams)
    by_bytes = 1e9 / (H200.memory_bandwidth_Bps * plain.memory(torch.tensor([1e9], dtype=torch.float64)).item())
    assert after[0].item() == pytest.approx(by_bytes, rel=1e-5) and before[0].item() > 10 * by_bytes  # float32 features
    assert after[1].item() == pytest.approx(before[1].item(), rel=1e-12)
    assert "streaming" in prior.OPTIONAL_PREDICTIVE_KEYS
    rows = _synthetic_rows(600)
    rows.category[:100] = ["optimizer"] * 100
    rows.gemm[:100] = False
    assert prior_fit.fit_device(rows, H200, steps=5)["streaming"] == ["optimizer"]
    assert "streaming" not in prior_fit.fit_device(rows, H200, steps=5, memory_by_category=False)
    assert "streaming" not in prior_fit.fit_device(rows, HARDWARE["cpu"], steps=5)


def _sample(n_kernels: int, kernel_s: float, family: str = "synthetic"):
    """A SYNTHETIC one-graph sample: n element-wise kernels per phase of a known device time each."""
    from torch_geometric.data import Data

    n = 3 * n_kernels
    x = torch.zeros(n, NODE_FEATURES)
    moved = kernel_s * H200.memory_bandwidth_Bps * 0.8  # memory-bound at the TRUE curve's plateau
    x[:, 1] = x[:, 2] = math.log2(1 + moved / 2)
    x_cat = torch.zeros(n, 4, dtype=torch.long)
    x_cat[:, 1] = ops.CATEGORIES.index("elementwise")
    x_cat[:, 2] = ops.DTYPE_ID["fp32"]
    phase = torch.arange(3).repeat_interleave(n_kernels)
    x_cat[:, 3] = phase
    return Data(x=x, x_cat=x_cat, phase=phase, num_nodes=n, family=family, precision="fp32",
                grad_bytes=torch.zeros(n))


def test_the_host_fit_recovers_the_issue_and_fixed_costs_of_a_launch_queue():
    truth = dataclasses.replace(prior.profile_from_dict(H200, {**TRUE, "memory": {"peak_fraction": 0.8}}),
                                host_issue_s=(40e-6, 60e-6, 20e-6), host_fixed_s=(300e-6, 200e-6, 100e-6))
    samples = []
    for n, t in ((10, 1e-6), (50, 2e-6), (200, 5e-6), (30, 400e-6), (400, 1e-5), (80, 100e-6)):
        s = _sample(n, t)
        ms = prior.phase_ms(s, truth)
        s.y = torch.tensor([[math.log(v) for v in ms]], dtype=torch.float32)  # forward, backward, optimizer, step
        samples.append(s)
    device_only = dataclasses.replace(truth, host_issue_s=None, host_fixed_s=None)
    host, fixed, report = prior_fit.fit_host(samples, device_only)
    assert host == pytest.approx([40e-6, 60e-6, 20e-6], abs=1.5e-6)
    assert fixed == pytest.approx([300e-6, 200e-6, 100e-6], abs=30e-6)
    assert all(r["mean_abs_log_error"] < 0.01 for r in report.values())
    errors = prior_fit.step_errors(samples, dataclasses.replace(truth, host_issue_s=tuple(host),
                                                                host_fixed_s=tuple(fixed)))
    assert errors["all"]["mape"] < 2 and errors["all"]["ratio_median"] == pytest.approx(1.0, abs=0.02)


def test_optimizer_issues_count_parameter_tensors_not_foreach_nodes():
    device = torch.tensor([1e-3, 2e-3], dtype=torch.float64)  # two foreach kernels
    grads = torch.tensor([0.0, 4.0, 4.0, 0.0, 8.0, 8.0, 8.0])  # five parameter tensors finalised
    spread = prior.optimizer_issues(device, grads)
    assert spread.numel() == 5 and spread.sum().item() == pytest.approx(3e-3)
    assert torch.equal(prior.optimizer_issues(device, None), device)


def test_leave_one_family_out_scores_each_family_with_a_fit_that_never_saw_it():
    truth = dataclasses.replace(prior.profile_from_dict(H200, {**TRUE, "memory": {"peak_fraction": 0.8}}),
                                host_issue_s=(40e-6, 60e-6, 20e-6), host_fixed_s=(300e-6, 200e-6, 100e-6))
    samples, seconds = [], {}
    for family, scale in (("a", 1.0), ("b", 2.0), ("c", 0.5)):
        for n, t in ((10, 1e-6), (50, 2e-6), (200, 5e-6), (30, 400e-6), (80, 100e-6)):
            s = _sample(n, t * scale, family)
            s.key = f"{family}-{n}"
            s.y = torch.tensor([[math.log(v) for v in prior.phase_ms(s, truth)]], dtype=torch.float32)
            seconds[s.key] = [prior.node_seconds(s.x, s.x_cat, truth)]
            samples.append(s)
    out = prior_fit.leave_one_family_out(samples, seconds, H200, by_category=False, intensity=False)
    assert set(out["by_family"]) == {"a", "b", "c"} and out["all"]["n"] == len(samples)
    assert out["all"]["mape"] < 3 and out["worst_family_mape"] < 5  # each family's kernels are made alike
    # a family whose steps the others cannot explain shows up as the worst
    for s in samples:
        if s.family == "c":
            s.y = s.y + math.log(1.5)
    skewed = prior_fit.leave_one_family_out(samples, seconds, H200, by_category=False, intensity=False)
    assert skewed["worst_family"] == "c" and skewed["worst_family_mape"] > 20


def test_leave_one_family_out_in_forked_processes_scores_the_same():
    """``jobs=2`` leaves the families out in two forked processes: the same per-family and overall figures
    as one process (SYNTHETIC steps, as above)."""
    truth = dataclasses.replace(prior.profile_from_dict(H200, {**TRUE, "memory": {"peak_fraction": 0.8}}),
                                host_issue_s=(40e-6, 60e-6, 20e-6), host_fixed_s=(300e-6, 200e-6, 100e-6))
    samples, seconds = [], {}
    for family, scale in (("a", 1.0), ("b", 2.0), ("c", 0.5)):
        for n, t in ((10, 1e-6), (200, 5e-6), (80, 100e-6)):
            s = _sample(n, t * scale, family)
            s.key = f"{family}-{n}"
            s.y = torch.tensor([[math.log(v * (1.3 if family == "c" else 1.0)) for v in prior.phase_ms(s, truth)]],
                               dtype=torch.float32)
            seconds[s.key] = [prior.node_seconds(s.x, s.x_cat, truth)]
            samples.append(s)
    kw = {"by_category": False, "intensity": False, "steps": 300}
    one = prior_fit.leave_one_family_out(samples, seconds, H200, **kw)
    two = prior_fit.leave_one_family_out(samples, seconds, H200, jobs=2, **kw)
    assert two["by_family"].keys() == one["by_family"].keys() == {"a", "b", "c"}
    for f, summary in one["by_family"].items():
        assert two["by_family"][f] == pytest.approx(summary)
    assert two["all"] == pytest.approx(one["all"])
    assert one["worst_family"] == "c" and prior_fit._LOFO_ARGS == ()


def test_a_convolution_law_with_channel_blocks_prices_unaligned_channels_and_the_weight_per_call():
    """SYNTHETIC dense bf16 convolutions whose multiply-adds cost twice as much where their input or output
    channels are not a multiple of ``prior.CONV_CHANNEL_BLOCK`` and whose weight costs once per call (a fast
    kernel's reorder into its blocked layout): ``fit_slow_conv(conv_blocks=True)`` recovers both, eight
    coefficients a direction, and prices the unaligned ones by them, where the six-cost law cannot tell them
    apart; a six-coefficient law reads the first six of the eight costs, so a section fitted before prices as
    it did; ``prior.slow_conv_terms`` reads both costs off a traced convolution."""
    g = torch.Generator().manual_seed(7)
    n = 800
    backward = torch.rand(n, generator=g) < 0.5
    batch = torch.randint(1, 17, (n,), generator=g).double()
    cin = 8.0 * torch.randint(1, 33, (n,), generator=g).double()  # multiples of 8: half unaligned
    cout = 8.0 * torch.randint(1, 33, (n,), generator=g).double()
    taps = torch.tensor([1.0, 9.0])[torch.randint(0, 2, (n,), generator=g)]
    positions = torch.randint(4, 57, (n,), generator=g).double() ** 2
    depth = cin * taps
    macs = batch * positions * cout * depth * torch.where(backward, 2.0, 1.0)
    unaligned = (cin % 16 != 0) | (cout % 16 != 0)
    zero = torch.zeros(n, dtype=torch.float64)
    terms = torch.stack([torch.ones(n, dtype=torch.float64), macs, zero, zero, zero,
                         batch * (cout + cin) * positions, cout * depth, torch.where(unaligned, macs, zero)], 1)
    costs = {"forward:bf16": [20e-6, 10e-12, 0, 0, 0, 0.4e-9, 1e-9, 10e-12],
             "backward:bf16": [30e-6, 10e-12, 0, 0, 0, 0.6e-9, 1e-9, 10e-12]}
    seconds = prior.slow_conv_seconds(terms, backward, ["bf16"] * n, costs) * torch.exp(
        0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    rows = prior_fit.KernelRows(2 * macs, macs / 10, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["conv"] * n, ["synthetic"] * n, seconds,
                                None, backward, slow_conv=terms)
    blocks = prior_fit.fit_slow_conv(rows, ("bf16",), conv_blocks=True)
    plain = prior_fit.fit_slow_conv(rows, ("bf16",))
    assert all(len(c) == len(prior.SLOW_CONV_TERMS) == 8 for c in blocks.values())
    assert all(len(c) == prior.SLOW_CONV_BASE_TERMS == 6 for c in plain.values())
    for key in costs:
        assert blocks[key][7] == pytest.approx(10e-12, rel=0.15)  # the unaligned multiply-add's own cost
        assert blocks[key][1] == pytest.approx(10e-12, rel=0.15)
    for law in (blocks, plain):
        priced = prior.slow_conv_seconds(terms, backward, ["bf16"] * n, law)
        ratio = lambda m: float(priced[m].sum() / seconds[m].sum())  # noqa: E731
        if law is blocks:
            assert ratio(unaligned) == pytest.approx(1.0, abs=0.05) and ratio(~unaligned) == pytest.approx(1.0, abs=0.05)
        else:  # one rate for both: the aligned ones over-priced, the unaligned under
            assert ratio(~unaligned) > 1.2 and ratio(unaligned) < 0.9
    # a law of six coefficients prices eight costs by the first six
    six = {k: v[:6] for k, v in costs.items()}
    torch.testing.assert_close(prior.slow_conv_seconds(terms, backward, ["bf16"] * n, six),
                               prior.slow_conv_seconds(terms[:, :6], backward, ["bf16"] * n, six))

    from conftest import py_spec
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    traced = trace_step(StepConfig(py_spec("conv2", c1=16, c2=24, groups=1), Shape(2, None, 16), "bf16"))
    tensors, _ = graph.to_tensors(traced)
    x, x_cat = tensors["x"], tensors["x_cat"]
    conv = torch.nonzero(x_cat[:, 1] == ops.CATEGORIES.index("conv")).flatten()
    read = prior.slow_conv_terms(x, x_cat)[conv]
    assert x_cat[conv, 3].tolist() == [0, 0, 1, 1]
    second_fwd, second_bwd = read[1], read[2]  # 16 -> 24 channels, 3x3: 24 is not a multiple of 16
    assert second_fwd[6].item() == pytest.approx(24 * 16 * 9, rel=0.02)  # weight elements, once per call
    assert second_fwd[7].item() == pytest.approx(second_fwd[1].item())
    assert second_bwd[7].item() == pytest.approx(second_bwd[1].item())
    first_fwd = read[0]  # 3 -> 16 channels: the input's 3 are not a multiple of 16 either
    assert first_fwd[7].item() == pytest.approx(first_fwd[1].item())


def test_slow_path_convolutions_get_a_sum_of_costs_in_their_shape():
    """SYNTHETIC bf16 convolutions whose time is a known sum of per-call, per-multiply-add, per weight element
    per sample and per im2col element costs (as torch's one-sample-at-a-time ``slow_conv2d`` on a CPU without
    a fast bf16 path): ``fit_slow_conv`` recovers the costs that carry the time, each direction its own, and
    fits nothing for a dtype it is not asked for; ``prior.slow_conv_terms`` reads a traced convolution's
    costs from its features alone, and a profile with the law prices it by them."""
    g = torch.Generator().manual_seed(5)
    n = 600
    backward = torch.rand(n, generator=g) < 0.5
    batch = torch.randint(1, 33, (n,), generator=g).double()
    cin, cout = torch.randint(3, 513, (n,), generator=g).double(), torch.randint(8, 513, (n,), generator=g).double()
    taps = torch.tensor([1.0, 9.0, 49.0])[torch.randint(0, 3, (n,), generator=g)]
    positions = torch.randint(1, 65, (n,), generator=g).double() ** 2
    depth = cin * taps
    macs = batch * positions * cout * depth * torch.where(backward, 2.0, 1.0)
    terms = torch.stack([torch.ones(n, dtype=torch.float64), macs, torch.zeros(n, dtype=torch.float64),
                         torch.where(backward, batch * cout * depth, 0.0), batch * depth * positions,
                         batch * (cout + cin) * positions], 1)
    costs = {"forward:bf16": [50e-6, 0.6e-9, 0.0, 0.0, 5e-9, 0.0], "backward:bf16": [80e-6, 0.05e-9, 0.0, 40e-9, 2e-9, 0.0]}
    truth = prior.slow_conv_seconds(terms, backward, ["bf16"] * n, costs)
    seconds = truth * torch.exp(0.1 * torch.randn(n, generator=g, dtype=torch.float64))
    rows = prior_fit.KernelRows(2 * macs, macs / 10, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["conv"] * n, ["synthetic"] * n, seconds,
                                None, backward, slow_conv=terms)
    assert prior_fit.fit_slow_conv(rows, ()) == {} and prior_fit.fit_slow_conv(rows, ("fp32",)) == {}
    law = prior_fit.fit_slow_conv(rows, ("bf16",))
    assert set(law) == set(costs) and all(c >= 0 for v in law.values() for c in v)
    for key, want in costs.items():
        big = max(range(6), key=lambda i: want[i] * float(terms[:, i].mean()))  # the cost that carries the time
        assert law[key][big] == pytest.approx(want[big], rel=0.1)
        m = backward == key.startswith("backward")
        priced = prior.slow_conv_seconds(terms[m], backward[m], ["bf16"] * int(m.sum()), law)
        assert float(priced.sum() / seconds[m].sum()) == pytest.approx(1.0, abs=0.05)

    from conftest import py_spec
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    traced = trace_step(StepConfig(py_spec("conv2", c1=16, c2=32, groups=1), Shape(4, None, 48), "bf16"))
    tensors, _ = graph.to_tensors(traced)
    x, x_cat = tensors["x"], tensors["x_cat"]
    conv = torch.nonzero(x_cat[:, 1] == ops.CATEGORIES.index("conv")).flatten()
    read = prior.slow_conv_terms(x, x_cat)[conv]
    assert x_cat[conv, 3].tolist() == [0, 0, 1, 1]  # forward 1, forward 2, backward 2, backward 1
    second_fwd, second_bwd = read[1], read[2]  # 16 -> 32 channels, 3x3, 48 x 48, batch 4
    macs = 4 * 48 * 48 * 32 * 16 * 9
    assert second_fwd[1].item() == pytest.approx(macs, rel=0.02)
    assert second_fwd[3].item() == 0.0 and second_fwd[4].item() == pytest.approx(4 * 16 * 9 * 48 * 48, rel=0.02)
    assert second_bwd[1].item() == pytest.approx(2 * macs, rel=0.02)
    assert second_bwd[3].item() == pytest.approx(4 * 32 * 16 * 9, rel=0.02)  # weight elements per sample
    spill = math.log(16 * 9 * 48 * 48 * 2 / prior.SLOW_CONV_CACHE_BYTES)
    assert second_fwd[2].item() == pytest.approx(macs * spill, rel=0.03)
    assert read[3, 3].item() > 0  # the first convolution's backward (no input gradient) still has its weight's
    none = prior.Profile(HARDWARE["cpu"], launch_floor_s=1e-9)
    priced = prior.node_seconds(x, x_cat, replace(none, slow_conv={k: tuple(v) for k, v in law.items()}))[conv]
    want = prior.slow_conv_seconds(read, x_cat[conv, 3] == prior.BACKWARD_PHASE, ["bf16"] * 4, law)
    torch.testing.assert_close(priced, want)
    assert not torch.allclose(prior.node_seconds(x, x_cat, none)[conv], want)
    # the kernel-level pricing (kernel_errors, prior_error_sources' tables) applies the law as node pricing does
    with_law = replace(none, slow_conv={k: tuple(v) for k, v in law.items()})
    torch.testing.assert_close(prior_fit._prior_seconds(rows, with_law),
                               prior.slow_conv_seconds(terms, backward, ["bf16"] * n, law).clamp_min(1e-9))
    assert not torch.allclose(prior_fit._prior_seconds(rows, none), prior_fit._prior_seconds(rows, with_law))


def test_attention_gets_a_sum_of_its_kernel_s_loop_costs_with_its_multiply_adds_at_the_peak():
    """SYNTHETIC fused attention kernels whose time is a known sum of per-block, per-row and per-score costs
    plus their multiply-adds at the hardware's GEMM peak (as aten's CPU flash attention): ``fit_attention``
    holds the multiply-adds at the peak, recovers the cost that carries the rest, each direction its own, and
    fits no law for a dtype with fewer than ``ATTENTION_MIN_ROWS`` kernels; ``prior.attention_terms`` reads a
    traced attention's costs from its features alone (aten's query block: 64 rows at 256 tokens), and a
    profile with the law prices it by them; a GPU section never takes the law."""
    cpu = HARDWARE["cpu"]
    g = torch.Generator().manual_seed(7)
    n = 400
    backward = torch.rand(n, generator=g) < 0.5
    batch, heads = torch.randint(1, 17, (n,), generator=g).double(), torch.randint(1, 9, (n,), generator=g).double()
    seq = torch.tensor([32.0, 64.0, 128.0, 256.0, 512.0, 1024.0])[torch.randint(0, 6, (n,), generator=g)]
    head = torch.tensor([32.0, 64.0])[torch.randint(0, 2, (n,), generator=g)]
    blocks = batch * heads * torch.ceil(seq / prior.attention_q_split(seq)) * torch.ceil(seq / 512)
    scores = batch * heads * seq * seq
    macs = 2 * scores * head * torch.where(backward, 2.5, 1.0)
    terms = torch.stack([torch.ones(n, dtype=torch.float64), blocks, batch * heads * seq, scores, macs,
                         4 * batch * heads * seq * head * 4], 1)
    dtype = ["fp32"] * (n - 10) + ["bf16"] * 10  # too few bf16 kernels for a law of their own
    mac_s = 2 / cpu.flops_rate("fp32", False, gemm=True)
    costs = {"forward:fp32": [0.0, 0.0, 0.0, 3e-9, mac_s, 0.0], "backward:fp32": [0.0, 70e-6, 0.0, 0.0, mac_s, 0.0]}
    truth = prior.slow_conv_seconds(terms, backward, dtype, costs)
    seconds = truth * torch.exp(0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    rows = prior_fit.KernelRows(2 * macs, terms[:, 5], dtype, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["attention"] * n, ["synthetic"] * n, seconds,
                                None, backward, attention=terms)
    law = prior_fit.fit_attention(rows, cpu)
    assert set(law) == set(costs) and all(c >= 0 for v in law.values() for c in v)
    mac = prior.ATTENTION_TERMS.index("mac")
    for key, want in costs.items():
        assert law[key][mac] == mac_s  # held at the peak, not fitted
        big = prior.ATTENTION_TERMS.index("score" if key.startswith("forward") else "block")
        assert law[key][big] == pytest.approx(want[big], rel=0.1)
        m = (backward == key.startswith("backward")) & torch.tensor([d == "fp32" for d in dtype])
        priced = prior.slow_conv_seconds(terms[m], backward[m], ["fp32"] * int(m.sum()), law)
        assert float(priced.sum() / seconds[m].sum()) == pytest.approx(1.0, abs=0.05)
    assert prior_fit.fit_attention(replace(rows, attention=None), cpu) == {}
    assert prior.attention_q_split(torch.tensor([100.0, 191.0, 192.0, 767.0, 768.0])).tolist() == [32, 32, 64, 64, 256]

    from conftest import RANDOM_TRANSFORMER, spec_of
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    spec = spec_of(RANDOM_TRANSFORMER, "causal=false", "dropout=0.0")  # 2 heads of 32, one layer (no dropout: aten's fused kernel)
    traced = trace_step(StepConfig(spec, Shape(3, 256), "fp32", target="cpu"))
    tensors, _ = graph.to_tensors(traced)
    x, x_cat = tensors["x"], tensors["x_cat"]
    att = torch.nonzero(x_cat[:, 1] == ops.CATEGORIES.index("attention")).flatten()
    assert x_cat[att, 3].tolist() == [0, 1]  # its forward and its fused backward
    read = prior.attention_terms(x, x_cat)[att]
    assert torch.isnan(prior.attention_terms(x, x_cat)[x_cat[:, 1] != ops.CATEGORIES.index("attention")]).all()
    for r in read:  # batch 3, heads 2, 256 tokens: 4 query blocks of 64 rows, one key block
        assert r[prior.ATTENTION_TERMS.index("block")].item() == 3 * 2 * 4
        assert r[prior.ATTENTION_TERMS.index("row")].item() == 3 * 2 * 256
        assert r[prior.ATTENTION_TERMS.index("score")].item() == pytest.approx(3 * 2 * 256 * 256, rel=0.01)
    assert read[1, mac].item() == pytest.approx(2.5 * read[0, mac].item(), rel=0.01)
    none = prior.Profile(cpu, launch_floor_s=1e-9)
    fitted = {k: tuple(v) for k, v in law.items()}
    priced = prior.node_seconds(x, x_cat, replace(none, attention=fitted))[att]
    torch.testing.assert_close(priced, prior.slow_conv_seconds(read, x_cat[att, 3] == prior.BACKWARD_PHASE,
                                                               ["fp32"] * 2, fitted))
    assert not torch.allclose(prior.node_seconds(x, x_cat, none)[att], priced)
    torch.testing.assert_close(prior_fit._prior_seconds(rows, replace(none, attention=fitted)),
                               prior.slow_conv_seconds(terms, backward, dtype, fitted).clamp_min(1e-9)
                               .where(torch.tensor([d == "fp32" for d in dtype]),
                                      prior_fit._prior_seconds(rows, none)))
    section = {"attention": {k: list(v) for k, v in fitted.items()}}
    assert prior.profile_from_dict(cpu, section).attention == fitted
    assert prior.profile_from_dict(HARDWARE["h200"], section).attention == {}
    assert prior_fit.section_options(section)["attention_law"] and not prior_fit.section_options({})["attention_law"]


def test_depthwise_convolutions_can_get_a_sum_of_costs_per_kernel_path():
    """SYNTHETIC depthwise kernels whose time is a call cost plus a multiply-add cost of their path (stride 1 or
    2, 3x3 or 5x5 taps): ``prior.depthwise_path_terms`` puts each kernel's multiply-adds and planes in its own
    path's columns (a stride of 3 counts as 2, 7 taps as 9), ``fit_depthwise_paths`` recovers the path costs
    that carry the time, and a profile with the law prices depthwise kernels by it in place of the power law;
    a GPU section never takes it."""
    g = torch.Generator().manual_seed(11)
    n = 600
    backward = torch.rand(n, generator=g) < 0.5
    batch, channels = torch.randint(1, 33, (n,), generator=g).double(), torch.randint(16, 961, (n,), generator=g).double()
    space = torch.randint(2, 65, (n,), generator=g).double() ** 2
    taps = torch.tensor([9.0, 25.0])[torch.randint(0, 2, (n,), generator=g)]
    stride = torch.tensor([1.0, 2.0])[torch.randint(0, 2, (n,), generator=g)]
    shapes = torch.stack([batch, channels, space, taps, stride], 1)
    terms = prior.depthwise_path_terms(shapes)
    paths = prior.DEPTHWISE_PATHS
    macs = batch * channels * space / stride ** 2 * taps
    for i, (st, t) in enumerate(paths):
        on = (stride == st) & (taps == t)
        torch.testing.assert_close(terms[:, 2 + i], torch.where(on, macs, 0.0))
        torch.testing.assert_close(terms[:, 2 + len(paths) + i], torch.where(on, batch * channels, 0.0))
    odd = prior.depthwise_path_terms(torch.tensor([[2.0, 8.0, 16.0, 7.0, 3.0], [float("nan")] * 5]))
    assert odd[0, 2 + paths.index((2, 9))] == 2 * 8 * 16 / 4 * 7 and torch.isnan(odd[1]).all()
    per_mac = {(1, 9): 0.3e-9, (1, 25): 1.0e-9, (2, 9): 5e-9, (2, 25): 6e-9}
    law = {key: [100e-6, 0.0] + [per_mac.get(p, 0.0) for p in paths] + [0.0] * len(paths)
           for key in ("forward:bf16", "backward:bf16")}
    truth = prior.slow_conv_seconds(terms, backward, ["bf16"] * n, law)
    seconds = truth * torch.exp(0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    rows = prior_fit.KernelRows(2 * macs, macs, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["conv"] * n, ["synthetic"] * n, seconds,
                                None, backward, depthwise=shapes)
    fitted = prior_fit.fit_depthwise_paths(rows)
    seven = [i for i, p in enumerate(paths) if p[1] == 49]  # no kernel ran a 7x7 path: the fit has no costs for it
    assert set(fitted) == set(law)
    for key in law:
        for p, want in per_mac.items():
            assert fitted[key][2 + paths.index(p)] == pytest.approx(want, rel=0.15)
        for i, c in enumerate(fitted[key]):
            unfitted = i - 2 in seven or i - 2 - len(paths) in seven
            assert (c is None) if unfitted else (c >= 0), (key, i, c)
    assert prior_fit.fit_depthwise_paths(replace(rows, depthwise=None)) == {}
    cpu = HARDWARE["cpu"]
    power = {"backward:bf16": (0.0, 0.5, 0.5, 0.3, 0.5), "forward:bf16": (0.0, 0.5, 0.5, 0.3, 0.5)}
    none = prior.Profile(cpu, launch_floor_s=1e-9, depthwise=power)
    coefficients = {k: prior.law_coefficients(v) for k, v in fitted.items()}
    with_law = replace(none, depthwise_paths=coefficients)
    torch.testing.assert_close(prior_fit._prior_seconds(rows, with_law),
                               prior.slow_conv_seconds(terms, backward, ["bf16"] * n, coefficients).clamp_min(1e-9))
    assert not torch.allclose(prior_fit._prior_seconds(rows, none), prior_fit._prior_seconds(rows, with_law))
    # a 7x7 kernel (a path the law knows nothing of) is left to the power law; a 3x3 one beside it is not
    new = torch.tensor([[4.0, 64.0, 1024.0, 49.0, 2.0], [4.0, 64.0, 1024.0, 9.0, 2.0]], dtype=torch.float64)
    one = torch.ones(2, dtype=torch.float64)
    unseen = prior_fit.KernelRows(2 * one, one, ["bf16"] * 2, torch.ones(2, dtype=torch.bool),
                                  torch.zeros(2, dtype=torch.bool), ["conv"] * 2, ["synthetic"] * 2,
                                  one, None, torch.ones(2, dtype=torch.bool), depthwise=new)
    by_law = prior.slow_conv_seconds(prior.depthwise_path_terms(new), torch.ones(2, dtype=torch.bool),
                                     ["bf16"] * 2, coefficients)
    assert torch.isnan(by_law[0]) and by_law[1] > 0
    priced, power_only = prior_fit._prior_seconds(unseen, with_law), prior_fit._prior_seconds(unseen, none)
    assert priced[0] == pytest.approx(float(power_only[0])) and priced[1] == pytest.approx(float(by_law[1]))
    section = {"depthwise_paths": fitted}
    read = prior.profile_from_dict(cpu, section).depthwise_paths
    assert set(read) == set(fitted) and all(
        (math.isnan(a) and b is None) or a == b for k in read for a, b in zip(read[k], fitted[k]))
    assert json.loads(json.dumps(section)) == section  # None is JSON's null: the section file stays plain JSON
    assert prior.profile_from_dict(HARDWARE["h200"], section).depthwise_paths == {}
    assert prior_fit.section_options(section)["depthwise_paths"] and not prior_fit.section_options({})["depthwise_paths"]


def test_protocol_refits_a_gpu_prior_per_fold_on_the_training_families_only():
    """gnn_ptp/protocol.py's PriorRefit: every sample of the fold is re-priced by a prior fitted to the
    training and validation configurations; the test family's kernels and steps (SYNTHETIC, made 3x slower
    than the truth) never reach the fit, so its prior stays the truth's and misses them by 3x."""
    from gnn_ptp.protocol import PriorRefit

    truth = dataclasses.replace(prior.profile_from_dict(H200, {**TRUE, "memory": {"peak_fraction": 0.8}}),
                                host_issue_s=(40e-6, 60e-6, 20e-6), host_fixed_s=(300e-6, 200e-6, 100e-6))
    parts, seconds = {"train": [], "val": [], "test": []}, {}
    for family, part, slow in (("a", "train", 1.0), ("b", "val", 1.0), ("c", "test", 3.0)):
        for n, t in ((10, 1e-6), (50, 2e-6), (200, 5e-6), (30, 400e-6), (80, 100e-6)):
            s = _sample(n, t, family)
            s.key, s.hardware_name = f"{family}-{n}", "h200"
            s.y = torch.tensor([[math.log(v * slow) for v in prior.phase_ms(s, truth)]], dtype=torch.float32)
            seconds[s.key] = [prior.node_seconds(s.x, s.x_cat, truth) * slow]
            s.prior_log_ms = torch.zeros(n * 3)  # a wrong prior, to be replaced
            parts[part].append(s)
    info = PriorRefit({"h200": seconds}, max_rows=None).apply(parts)
    assert info["h200"]["fit_steps"] == 10  # train + val, not test

    def ape(s):
        return abs(float(s.prior_log_ms.double().exp().sum()) / float(s.y[0, 3].double().exp()) - 1) * 100

    assert max(ape(s) for s in parts["train"] + parts["val"]) < 5
    assert all(60 < ape(s) < 70 for s in parts["test"])  # priced as the truth: 1/3 of the slowed steps
    # a hardware kind without a training configuration in the fold keeps its prior
    before = [s.prior_log_ms.clone() for part in parts.values() for s in part]
    assert PriorRefit({"h100": seconds}).apply(parts) == {}
    assert all(torch.equal(a, s.prior_log_ms) for a, s in zip(before, (s for p in parts.values() for s in p)))


def test_protocol_refits_a_cpu_kind_s_prior_with_the_depthwise_law_by_default_never_a_gpu_s(monkeypatch):
    """``PriorRefit`` asks ``prior_fit.fit`` for the depthwise law on a CPU kind by default, not with
    ``depthwise_law=False`` (``evaluate --protocol ... --no-depthwise-law``), never on a GPU (SYNTHETIC
    samples; the fit is stubbed to record what it was asked)."""
    from gnn_ptp import descriptor
    from gnn_ptp.protocol import PriorRefit

    asked = []

    def fit(samples, seconds, hw, max_rows=None, **kw):
        asked.append((hw.kind, kw.get("depthwise")))
        raise StopIteration  # what was asked is all this test needs
    monkeypatch.setattr(prior_fit, "fit", fit)
    cpu = descriptor.stored_cpus()["amd-epyc"]
    for name, kinds in (("amd-epyc", {"amd-epyc": cpu}), ("h200", {})):
        s = _sample(10, 1e-6, "a")
        s.key, s.hardware_name = "a-10", name
        parts = {"train": [s], "val": [], "test": []}
        for kw in ({"depthwise_law": False}, {}):
            with pytest.raises(StopIteration):
                PriorRefit({name: {}}, descriptors=kinds, **kw).apply(parts)
    assert asked == [("cpu", False), ("cpu", True), ("gpu", False), ("gpu", False)]


def test_section_options_read_how_a_shipped_section_was_fitted():
    """``prior_fit.section_options``: pooled curves where a section carries no per-category fractions (the
    AMD CPU kinds' shipped sections until the nineteenth session), per-category ones and the channel ramp
    where it does (every CPU section since, the GPU's), checked on SYNTHETIC sections and on the shipped
    file's."""
    from gnn_ptp import prior

    assert prior_fit.section_options({"gemm": {}}) == {"vector_by_category": False, "memory_by_category": False,
                                                       "channel_ramp": False, "conv_intensity": "tensor",
                                                       "gemm_layouts": False, "layout_curves": False,
                                                       "bounded_layout_curves": False, "layout_levels": False,
                                                       "slow_conv": (), "depthwise_probes": False,
                                                       "step_weights": False, "profiler_cost": False,
                                                       "depthwise_stride": False, "depthwise_floor": False,
                                                       "attention_law": False, "depthwise_paths": False,
                                                       "conv_blocks": False, "matmul_cap": False}
    # a depthwise law of five coefficients (no stride term) is not a stride law
    assert not prior_fit.section_options({"gemm": {}, "depthwise": {"backward:bf16": [0.0] * 5}})["depthwise_stride"]
    full = {"vector_fraction": {"norm": 0.5}, "memory_fraction": {"copy:fp32": 1.0}, "channel_ramp": {"x": [1, 1]},
            "conv_intensity": "gemm", "gemm_layouts": True, "gemm": {"matmul@tn:bf16": {"size_max": 1e9}},
            "layout_levels": True, "slow_conv": {"forward:bf16": [0.0] * 6, "backward:bf16": [0.0] * 6},
            "depthwise_probes": True, "step_weights": True, "profiler_cost": True,
            "depthwise": {"forward:bf16": [0.0] * 5, "backward:bf16": [0.0] * 6},
            "depthwise_floor": {"backward:bf16": 1e-9}, "attention": {"backward:bf16": [0.0] * 6},
            "depthwise_paths": {"backward:bf16": [0.0] * 14}}
    assert prior_fit.section_options(full) == {"vector_by_category": True, "memory_by_category": True,
                                               "channel_ramp": True, "conv_intensity": "gemm", "gemm_layouts": True,
                                               "layout_curves": True, "bounded_layout_curves": True,
                                               "layout_levels": True, "slow_conv": ("bf16",), "depthwise_probes": True,
                                               "step_weights": True, "profiler_cost": True,
                                               "depthwise_stride": True, "depthwise_floor": True,
                                               "attention_law": True, "depthwise_paths": True,
                                               "conv_blocks": False, "matmul_cap": False}
    # a dense convolutions' law of eight coefficients was fitted with its channel-block costs
    assert prior_fit.section_options({"gemm": {}, "slow_conv": {"forward:bf16": [0.0] * 8}})["conv_blocks"]
    # a matmul curve with a largest fraction was fitted with the cap
    assert prior_fit.section_options({"gemm": {"matmul:bf16": {"fraction_max": 1.1}}})["matmul_cap"]
    table = prior.calibration()
    assert prior_fit.section_options(table["cpu"])["vector_by_category"]  # per-category since the 19th session
    assert prior_fit.section_options(table["cpu-amd-epyc-family-26-model-2"])["memory_by_category"]
    assert prior_fit.section_options(table["h100"])["channel_ramp"]


def test_protocol_refits_a_prior_with_the_options_it_is_given_per_hardware(monkeypatch):
    """``PriorRefit(options=...)`` hands each hardware's curve options (its shipped section's, by
    ``protocol.prior_refit(as_shipped=True)``) to ``prior_fit.fit``; a hardware without any gets the
    defaults (SYNTHETIC samples; the fit is stubbed to record what it was asked)."""
    from gnn_ptp.protocol import PriorRefit

    asked = []

    def fit(samples, seconds, hw, max_rows=None, **kw):
        asked.append({k: kw.get(k) for k in ("vector_by_category", "channel_ramp")})
        raise StopIteration
    monkeypatch.setattr(prior_fit, "fit", fit)
    s = _sample(10, 1e-6, "a")
    s.key, s.hardware_name = "a-10", "h200"
    parts = {"train": [s], "val": [], "test": []}
    for options in ({"h200": {"vector_by_category": False, "channel_ramp": True}}, {}):
        with pytest.raises(StopIteration):
            PriorRefit({"h200": {}}, options=options).apply(parts)
    assert asked == [{"vector_by_category": False, "channel_ramp": True},
                     {"vector_by_category": None, "channel_ramp": None}]


def test_the_subsample_does_not_depend_on_the_order_configurations_come_in():
    """SYNTHETIC rows of two 'configurations', each with its ``row_draws``: concatenated in either order,
    the subsample keeps the same rows (the per-fold prior of a protocol run does not follow its seed)."""
    a, b = _synthetic_rows(600, seed=1), _synthetic_rows(900, seed=2)
    a.draw, b.draw = prior_fit.row_draws("config-a", 600), prior_fit.row_draws("config-b", 900)
    assert torch.equal(a.draw, prior_fit.row_draws("config-a", 600))  # fixed by the key
    assert not torch.equal(a.draw, prior_fit.row_draws("config-b", 600))

    def cat(first, second):
        return prior_fit.KernelRows(
            torch.cat([first.flops, second.flops]), torch.cat([first.moved, second.moved]),
            first.dtype + second.dtype, torch.cat([first.gemm, second.gemm]),
            torch.cat([first.tensor_core, second.tensor_core]), first.category + second.category,
            first.family + second.family, torch.cat([first.seconds, second.seconds]),
            torch.cat([first.draw, second.draw]))

    kept_ab = prior_fit.subsample(cat(a, b), 500)
    kept_ba = prior_fit.subsample(cat(b, a), 500)
    assert len(kept_ab) == len(kept_ba) == 500
    assert torch.equal(kept_ab.seconds.sort().values, kept_ba.seconds.sort().values)
    every = torch.cat([a.draw, b.draw]).sort().values
    assert kept_ab.draw.max() == every[499]  # the 500 smallest draws


CPU = HARDWARE["cpu"]
CPU_TRUE = {"gemm": {"fp32": {"peak_fraction": 0.8, "half_size": 2e6, "slope": 1.0}},
            "vector": {"peak_fraction": 3.0},
            "memory": {"peak_fraction": 4.0, "half_size": 4e6, "slope": -0.6},  # in cache beats DRAM
            "launch_floor_s": 1e-6}


def test_a_cpu_fit_recovers_curves_above_the_quoted_peak_and_falling_with_size():
    """SYNTHETIC CPU kernels: a GPU-shaped fit (fraction <= 1, rising curves) cannot price a CPU whose
    arrays in cache move 4x faster than its DRAM bandwidth and slow down as they outgrow the cache."""
    g = torch.Generator().manual_seed(3)
    n = 3000
    gemm = torch.rand(n, generator=g) < 0.3
    moved = 10 ** (3 + 6 * torch.rand(n, generator=g, dtype=torch.float64))
    flops = torch.where(gemm, moved ** 1.3, moved / 8)
    rows = prior_fit.KernelRows(flops, moved, ["fp32"] * n, gemm, torch.zeros(n, dtype=torch.bool),
                                ["matmul" if x else "elementwise" for x in gemm.tolist()], ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64))
    rows.seconds = prior_fit._prior_seconds(rows, prior.profile_from_dict(CPU, CPU_TRUE)) * torch.exp(
        0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    fitted = prior_fit.fit_device(rows, CPU, steps=1500, intensity=False)
    assert fitted["memory"]["peak_fraction"] > 2 and fitted["memory"]["slope"] < 0
    assert prior_fit.kernel_errors(rows, prior_fit.device_profile(CPU, fitted))["all"]["median_ape"] < 8
    gpu_shaped = prior_fit.fit_device(rows, dataclasses.replace(CPU, kind="gpu"), steps=1500, intensity=False)
    assert prior_fit.kernel_errors(rows, prior_fit.device_profile(CPU, gpu_shaped))["all"]["median_ape"] > 20


def _fresh_rows(cost: dict, n: int = 3000):
    """SYNTHETIC element-wise CPU kernels priced by ``CPU_TRUE`` (3 % noise), half of those moving over
    100 MB with a fresh output above ``cost``'s threshold that pays ``cost``'s page faults; the rows and
    which kernels have such an output."""
    g = torch.Generator().manual_seed(5)
    moved = 10 ** (3 + 6 * torch.rand(n, generator=g, dtype=torch.float64))
    fresh_out = (torch.rand(n, generator=g) < 0.5) & (moved > 10 ** 8)
    fresh = torch.stack([torch.where(fresh_out, moved / 3, 0.0)] * 2, 1)
    rows = prior_fit.KernelRows(moved / 8, moved, ["fp32"] * n, torch.zeros(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["elementwise"] * n, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64), fresh=fresh)
    true = dataclasses.replace(prior.profile_from_dict(CPU, CPU_TRUE), fresh_threshold_bytes=cost["threshold_bytes"],
                               fresh_s_per_byte=cost["s_per_byte"])
    noise = torch.exp(0.03 * torch.randn(n, generator=g, dtype=torch.float64))
    rows.seconds = prior_fit._prior_seconds(rows, true) * noise
    return rows, fresh_out


def test_a_cpu_fit_with_the_measured_fresh_allocation_cost_prices_large_fresh_outputs():
    """SYNTHETIC CPU kernels, some of whose outputs are fresh allocations above a 32 MiB mmap threshold
    and pay 0.25 ms per MiB of page faults: given that measured cost, the fit recovers the curves and
    prices those kernels within a few per cent (the profile keeps the cost); without it the curves
    cannot (a kernel's bytes do not say whether its output was fresh)."""
    cost = {"threshold_bytes": 32 * 2 ** 20, "s_per_byte": 0.25e-3 / 2 ** 20}
    rows, fresh_out = _fresh_rows(cost)
    fitted = prior_fit.fit_device(rows, CPU, steps=1500, intensity=False, fresh=cost)
    profile = prior_fit.device_profile(CPU, fitted)
    assert profile.fresh_threshold_bytes == cost["threshold_bytes"] and profile.fresh_s_per_byte == cost["s_per_byte"]
    mask = fresh_out
    pick = mask.nonzero().flatten().tolist()
    big = prior_fit.KernelRows(rows.flops[mask], rows.moved[mask], ["fp32"] * len(pick), rows.gemm[mask],
                               rows.tensor_core[mask], ["elementwise"] * len(pick), ["synthetic"] * len(pick),
                               rows.seconds[mask], fresh=rows.fresh[mask])
    assert prior_fit.kernel_errors(big, profile)["all"]["median_ape"] < 8
    blind = prior_fit.fit_device(rows, CPU, steps=1500, intensity=False)
    assert prior_fit.kernel_errors(big, prior_fit.device_profile(CPU, blind))["all"]["median_ape"] > 15


def test_a_cpu_fit_can_fit_the_fresh_allocation_cost_itself_where_kernels_allocate_above_the_threshold():
    """SYNTHETIC CPU kernels as above, 0.25 ms per MiB of page faults planted: given only the threshold
    (``s_per_byte`` None), the fit recovers the cost per byte within 10 % and says it fitted it; on rows
    where nothing is allocated above the threshold it has nothing to fit and gives no cost at all."""
    planted = 0.25e-3 / 2 ** 20
    rows, fresh_out = _fresh_rows({"threshold_bytes": 32 * 2 ** 20, "s_per_byte": planted})
    fitted = prior_fit.fit_device(rows, CPU, steps=1500, intensity=False,
                                  fresh={"threshold_bytes": 32 * 2 ** 20, "s_per_byte": None})
    assert fitted["fresh"]["fitted"] and fitted["fresh"]["faulted_kernels"] == int(fresh_out.sum())
    assert abs(fitted["fresh"]["s_per_byte"] / planted - 1) < 0.10
    assert prior_fit.device_profile(CPU, fitted).fresh_s_per_byte == fitted["fresh"]["s_per_byte"]
    small = prior_fit.fit_device(rows, CPU, steps=200, intensity=False,
                                 fresh={"threshold_bytes": 2.0 ** 40, "s_per_byte": None})
    assert "fresh" not in small and prior_fit.device_profile(CPU, small).fresh_s_per_byte == 0.0


def test_a_cpu_step_is_serial_and_its_host_fit_recovers_the_costs():
    """On a CPU the thread that issues a kernel runs it: a phase is fixed + issues x host + kernels, with
    no queue that could hide the host (SYNTHETIC samples, costs chosen here)."""
    truth = dataclasses.replace(prior.profile_from_dict(CPU, {**CPU_TRUE, "memory": {"peak_fraction": 1.0}}),
                                host_issue_s=(12e-6, 8e-6, 3e-6), host_fixed_s=(500e-6, 300e-6, 50e-6))
    assert truth.serial and not prior.profile_from_dict(H200, TRUE).serial
    s = _sample(100, 2e-4)
    s.x[:, 1] = s.x[:, 2] = math.log2(1 + 2e-4 * CPU.memory_bandwidth_Bps / 2)  # 200 us each on this CPU
    ms = prior.phase_ms(s, truth)
    kernels = float(prior.node_seconds(s.x[:100], s.x_cat[:100], truth).sum())
    assert ms[0] == pytest.approx((500e-6 + 100 * 12e-6 + kernels) * 1e3)  # the GPU queue would give ~kernels
    samples = []
    for n, t in ((10, 1e-6), (50, 2e-5), (200, 5e-6), (30, 4e-4), (400, 1e-5), (80, 1e-4)):
        s = _sample(n, t)
        s.x[:, 1] = s.x[:, 2] = math.log2(1 + t * CPU.memory_bandwidth_Bps / 2)
        s.y = torch.tensor([[math.log(v) for v in prior.phase_ms(s, truth)]], dtype=torch.float32)
        samples.append(s)
    host, fixed, report = prior_fit.fit_host(samples, dataclasses.replace(truth, host_issue_s=None,
                                                                           host_fixed_s=None))
    assert host == pytest.approx([12e-6, 8e-6, 3e-6], abs=1e-6)
    assert fixed == pytest.approx([500e-6, 300e-6, 50e-6], abs=30e-6)
    assert all(r["mean_abs_log_error"] < 0.01 for r in report.values())


def _cpu_fold(train_kind: str, test_kind: str, with_profiles: bool):
    """A SYNTHETIC hardware-protocol fold: the train kind's samples (train + val), the test kind's (test),
    element-wise kernels priced by the shipped CPU prior; per-node 'measured' seconds for the train kind."""
    from gnn_ptp import descriptor
    from gnn_ptp.protocol import PriorRefit
    from tests.test_descriptor import synthetic_cpu

    kinds = {"amd-epyc": descriptor.stored_cpus()["amd-epyc"], "synthetic-slow-cpu": synthetic_cpu(0.5)}
    truth = kinds["amd-epyc"].profile()
    parts, seconds = {"train": [], "val": [], "test": []}, {}
    for kind, part in ((train_kind, "train"), (train_kind, "val"), (test_kind, "test")):
        for n, t in ((10, 1e-6), (50, 2e-5), (200, 5e-6), (30, 4e-4), (80, 1e-4)):
            s = _sample(n, t, f"{part}-family")
            s.x[:, 1] = s.x[:, 2] = math.log2(1 + t * CPU.memory_bandwidth_Bps / 2)
            s.key, s.hardware_name = f"{kind}-{part}-{n}", kind
            s.y = torch.tensor([[math.log(v) for v in prior.phase_ms(s, truth)]], dtype=torch.float32)
            seconds[s.key] = [prior.node_seconds(s.x, s.x_cat, truth)]
            s.prior_log_ms = torch.zeros(3 * n)
            parts[part].append(s)
    refit = PriorRefit({train_kind: seconds} if with_profiles else {}, max_rows=None, descriptors=kinds)
    return refit, parts, kinds


def test_a_cpu_kind_only_tested_on_gets_the_fold_s_fit_moved_by_its_measured_ceilings():
    """Hardware protocol, first CPU kind -> a SYNTHETIC one with every rate halved: the test kind is priced
    by the prior fitted to the training kind in this fold, transferred (twice the time, host costs too),
    never by a prior that has seen its own steps."""
    refit, parts, kinds = _cpu_fold("amd-epyc", "synthetic-slow-cpu", with_profiles=True)
    info = refit.apply(parts)
    assert info["amd-epyc"]["fit_steps"] == 10
    assert info["synthetic-slow-cpu"] == {"transferred_from": "amd-epyc"}
    for home, slow in zip(parts["train"], parts["test"]):  # the same graphs, half the rates
        torch.testing.assert_close(slow.prior_log_ms, home.prior_log_ms + math.log(2.0), rtol=0, atol=1e-4)


def test_the_hardware_protocol_moves_a_cpu_prior_in_the_transfer_mode_it_is_given(monkeypatch):
    """``--transfer-mode split`` reaches ``descriptor.transfer``; with every rate halved (the SYNTHETIC
    kind) the split moves the steps 2x too: the ceilings' time and the rest both move by one half."""
    from gnn_ptp import descriptor

    modes, transfer = [], descriptor.transfer

    def recorded(profile, source, target, mode=None):
        modes.append((source.name, target.name, mode))
        return transfer(profile, source, target, mode)

    monkeypatch.setattr(descriptor, "transfer", recorded)
    refit, parts, kinds = _cpu_fold("amd-epyc", "synthetic-slow-cpu", with_profiles=True)
    refit.mode = "split"
    assert refit.apply(parts)["synthetic-slow-cpu"] == {"transferred_from": "amd-epyc"}
    assert ("amd-epyc", "synthetic-slow-cpu", "split") in modes
    for home, slow in zip(parts["train"], parts["test"]):
        torch.testing.assert_close(slow.prior_log_ms, home.prior_log_ms + math.log(2.0), rtol=0, atol=1e-4)


def test_a_kind_left_out_of_several_gets_the_nearest_kind_s_fit_or_the_geometric_mean_of_all():
    """Hardware protocol, ``rest`` fold: two training kinds, the first CPU kind and a SYNTHETIC one that
    claims twice its rates but runs the same steps no faster; the SYNTHETIC test kind has half the first
    kind's rates. Moved from the first kind its steps take 2x, from the other 4x (its fit found half the
    efficiency). ``nearest`` (the default) prices it from the first kind, whose ceilings are 2x away (the
    other's 4x): 2x; ``mean`` takes the geometric mean of the two, 2.83x."""
    from gnn_ptp import descriptor
    from gnn_ptp.protocol import PriorRefit
    from tests.test_descriptor import synthetic_cpu

    kinds = {"amd-epyc": descriptor.stored_cpus()["amd-epyc"], "synthetic-slow-cpu": synthetic_cpu(0.5),
             "synthetic-fast-cpu": synthetic_cpu(2.0, "synthetic-fast-cpu")}
    truth = kinds["amd-epyc"].profile()
    parts, seconds = {"train": [], "val": [], "test": []}, {"amd-epyc": {}, "synthetic-fast-cpu": {}}
    for kind, part in (("amd-epyc", "train"), ("synthetic-fast-cpu", "train"), ("amd-epyc", "val"),
                       ("synthetic-fast-cpu", "val"), ("synthetic-slow-cpu", "test")):
        for n, t in ((10, 1e-6), (50, 2e-5), (200, 5e-6), (30, 4e-4), (80, 1e-4)):
            s = _sample(n, t, f"{part}-family")
            s.x[:, 1] = s.x[:, 2] = math.log2(1 + t * CPU.memory_bandwidth_Bps / 2)
            s.key, s.hardware_name = f"{kind}-{part}-{n}", kind
            s.y = torch.tensor([[math.log(v) for v in prior.phase_ms(s, truth)]], dtype=torch.float32)
            if kind in seconds:
                seconds[kind][s.key] = [prior.node_seconds(s.x, s.x_cat, truth)]
            s.prior_log_ms = torch.zeros(3 * n)
            parts[part].append(s)
    home = [s for s in parts["train"] if s.hardware_name == "amd-epyc"]
    info = PriorRefit(seconds, max_rows=None, descriptors=kinds, transfer="mean").apply(parts)
    assert info["synthetic-slow-cpu"] == {"transferred_from": ["amd-epyc", "synthetic-fast-cpu"]}
    for h, slow in zip(home, parts["test"]):  # the same graphs
        # nodes moved 2x and 4x: their geometric mean, 2.83x (nearest: 2x, the far kind alone: 4x). Each kind's
        # fitted host costs move with it and are averaged arithmetically (``_price``), so the step sits within
        # 3 % of 2.83x, not 0.1 % as it did until the thirty-eighth session's section (fitted with the profiler's
        # cost taken off) gave the reference kind host costs of 1-13 us a kernel and 150-375 us a phase
        torch.testing.assert_close(slow.prior_log_ms, h.prior_log_ms + 1.5 * math.log(2.0), rtol=0, atol=0.03)
        assert slow.host_s.shape == h.host_s.shape
    info = PriorRefit(seconds, max_rows=None, descriptors=kinds).apply(parts)
    assert info["synthetic-slow-cpu"] == {"transferred_from": "amd-epyc"}
    for h, slow in zip(home, parts["test"]):
        torch.testing.assert_close(slow.prior_log_ms, h.prior_log_ms + math.log(2.0), rtol=0, atol=1e-3)


def test_a_fold_whose_shipped_prior_has_seen_the_test_steps_falls_back_to_kernel_curves():
    """Second kind -> first, the second kind without profiles: nothing in the fold can be refitted, and the
    shipped CPU prior was fitted to the first kind's steps, so both kinds are priced with the curves fitted
    to kernel microbenchmarks alone (``microbench-cpu``), not with the steps under test."""
    refit, parts, kinds = _cpu_fold("synthetic-slow-cpu", "amd-epyc", with_profiles=False)
    assert kinds["amd-epyc"].steps_fitted_on() == "amd-epyc"
    info = refit.apply(parts)
    assert info == {"amd-epyc": {"section": "microbench-cpu"}, "synthetic-slow-cpu": {"section": "microbench-cpu"}}
    want = prior.log_node_ms({"x": parts["test"][0].x, "x_cat": parts["test"][0].x_cat,
                              "phase": parts["test"][0].phase, "grad_bytes": None},
                             kinds["amd-epyc"].profile("microbench-cpu"))
    torch.testing.assert_close(parts["test"][0].prior_log_ms, want)


def test_a_fused_backward_kernel_gets_its_own_curve_where_it_runs_another_rate():
    """SYNTHETIC convolutions on a CPU: backward ones (one fused node) at a third of the forward's rate per
    FLOP. One convolution curve (the default) must price both at a compromise; with ``backward_curves``
    each gets its own, which ``prior.node_seconds`` then prices backward nodes with."""
    cpu = HARDWARE["cpu"]
    g = torch.Generator().manual_seed(5)
    n = 2000
    backward = torch.rand(n, generator=g) < 0.5
    flops = 10 ** (6 + 3 * torch.rand(n, generator=g, dtype=torch.float64))
    moved = flops / 20
    rows = prior_fit.KernelRows(flops, moved, ["fp32"] * n, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["conv"] * n, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64), None, backward)
    noise = torch.exp(0.03 * torch.randn(n, generator=g, dtype=torch.float64))
    rows.seconds = flops / (cpu.flops_rate("fp32", False, gemm=True) * torch.where(backward, 0.2, 0.6)) * noise
    one = prior_fit.device_profile(cpu, prior_fit.fit_device(rows, cpu, steps=800))
    own = prior_fit.fit_device(rows, cpu, steps=800, backward_curves=True)
    assert "conv_backward:fp32" in own["gemm"] and "conv:fp32" in own["gemm"]
    own = prior_fit.device_profile(cpu, own)
    assert prior_fit.kernel_errors(rows, own)["all"]["median_ape"] < 5
    assert prior_fit.kernel_errors(rows, one)["all"]["median_ape"] > 20

    # prior.node_seconds: the same node in the backward phase takes the backward curve
    x = torch.zeros(2, NODE_FEATURES)
    x[:, 0], x[:, 1] = math.log2(1 + 1e8), math.log2(1 + 5e6)
    x_cat = torch.tensor([[0, ops.CATEGORIES.index("conv"), ops.DTYPE_ID["fp32"], phase] for phase in (0, 1)])
    fwd, bwd = prior.node_seconds(x, x_cat, own).tolist()
    assert bwd / fwd == pytest.approx(3.0, rel=0.1)
    fwd, bwd = prior.node_seconds(x, x_cat, one).tolist()
    assert bwd == pytest.approx(fwd)  # no backward curve: the forward's


def test_grouped_convolutions_get_their_own_forward_and_backward_curves():
    """SYNTHETIC convolutions on a CPU: dense ones at 0.6 of the fp32 GEMM rate both ways, grouped ones
    (``prior.grouped_conv``) at 0.3 forward and 0.02 backward, as oneDNN's depthwise backward runs on the
    project's CPU kinds. One convolution curve (the default) prices the dense ones off too; with
    ``grouped_conv`` the dense curve is the dense kernels' and ``prior.node_seconds`` prices a grouped node
    by its own curves, picked from its features alone."""
    cpu = HARDWARE["cpu"]
    rate = cpu.flops_rate("fp32", False, gemm=True)
    g = torch.Generator().manual_seed(7)
    n = 3000
    backward = torch.rand(n, generator=g) < 0.5
    grouped = torch.rand(n, generator=g) < 0.3
    flops = 10 ** (5 + 3 * torch.rand(n, generator=g, dtype=torch.float64))

    def rows_of(m):
        k = int(m.sum())
        return prior_fit.KernelRows(flops[m], flops[m] / 20, ["fp32"] * k, torch.ones(k, dtype=torch.bool),
                                    torch.zeros(k, dtype=torch.bool), ["conv"] * k, ["synthetic"] * k,
                                    torch.zeros(k, dtype=torch.float64), None, backward[m], None, grouped[m])
    rows, dense = rows_of(torch.ones(n, dtype=torch.bool)), rows_of(~grouped)
    fraction = torch.where(grouped, torch.where(backward, 0.02, 0.3), torch.tensor(0.6, dtype=torch.float64))
    rows.seconds = flops / (rate * fraction) * torch.exp(0.03 * torch.randn(n, generator=g, dtype=torch.float64))
    dense.seconds = rows.seconds[~grouped]
    one = prior_fit.device_profile(cpu, prior_fit.fit_device(rows, cpu, steps=800, intensity=False))
    fitted = prior_fit.fit_device(rows, cpu, steps=800, intensity=False, grouped_conv=True)
    assert {"conv:fp32", "conv_grouped:fp32", "conv_grouped_backward:fp32"} <= set(fitted["gemm"])
    own = prior_fit.device_profile(cpu, fitted)
    assert prior_fit.kernel_errors(rows, own)["all"]["median_ape"] < 5
    assert prior_fit.kernel_errors(dense, own)["all"]["median_ape"] < 5
    assert prior_fit.kernel_errors(dense, one)["all"]["median_ape"] > 20

    # prior.node_seconds on traced convolutions (their bytes set to the synthetic kernels' FLOPs / 20)
    from conftest import py_spec
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    def conv_nodes(groups):
        traced = trace_step(StepConfig(py_spec("conv2", c1=16, c2=16, groups=groups), Shape(4, None, 48), "fp32"))
        tensors, _ = graph.to_tensors(traced)
        conv = tensors["x_cat"][:, 1] == ops.CATEGORIES.index("conv")
        x = tensors["x"][conv].clone()
        x[:, 1] = x[:, 2] = torch.log2(1 + prior._unlog(x[:, 0]) / 40)
        return x, tensors["x_cat"][conv]

    x, x_cat = conv_nodes(16)  # a depthwise 3x3 second convolution: 16 groups of 1 channel
    assert x_cat[:, 3].tolist() == [0, 0, 1, 1]  # forward 1, forward 2, backward 2, backward 1
    assert prior.grouped_conv(x, x_cat).tolist() == [False, True, True, False]
    by_own, by_one = prior.node_seconds(x, x_cat, own), prior.node_seconds(x, x_cat, one)
    assert by_own[2] / by_own[1] == pytest.approx(2 * 0.3 / 0.02, rel=0.25)  # twice the FLOPs at its own rate
    assert by_one[2] / by_one[1] == pytest.approx(2.0, rel=0.25)  # one curve: twice the FLOPs, ~twice the time
    for groups in (1, 4):  # dense, and 4 groups of a 3x3 kernel: reduction depth 36 >= 16 channels
        x, x_cat = conv_nodes(groups)
        assert not prior.grouped_conv(x, x_cat).any()
        dense_s = prior._unlog(x[:, 0]) / (rate * 0.6)
        torch.testing.assert_close(prior.node_seconds(x, x_cat, own), dense_s, rtol=0.1, atol=0)


def _depthwise_shapes(n: int, g: torch.Generator, batch, channels, side) -> torch.Tensor:
    """SYNTHETIC depthwise shapes [n, 5] (``prior.depthwise_shapes``' columns): batch, channels and image side
    drawn uniformly from the half-open ranges given, pixels = side ** 2, taps of 3x3, 5x5 or 7x7 kernels,
    stride 1 or 2."""
    return torch.stack([torch.randint(*batch, (n,), generator=g), torch.randint(*channels, (n,), generator=g),
                        torch.randint(*side, (n,), generator=g) ** 2,
                        torch.tensor([9, 25, 49])[torch.randint(0, 3, (n,), generator=g)],
                        torch.randint(1, 3, (n,), generator=g)], 1).double()


def test_depthwise_convolutions_get_a_power_law_in_their_shape():
    """SYNTHETIC depthwise convolutions whose time is a known power law in batch, channels, space and taps
    (not in their FLOPs), beside dense ones on a FLOPs curve: ``fit_depthwise`` recovers the law's exponents,
    its summed time is unbiased despite log-normal noise, the dense curve is fitted to the dense rows alone,
    and ``prior.node_seconds`` prices a traced depthwise node (read by ``prior.depthwise_shapes`` from its
    features alone) by the law and a dense one by the curve."""
    cpu = HARDWARE["cpu"]
    rate = cpu.flops_rate("fp32", False, gemm=True)
    g = torch.Generator().manual_seed(3)
    n = 4000
    depthwise = torch.rand(n, generator=g) < 0.4
    backward = torch.rand(n, generator=g) < 0.5
    shapes = _depthwise_shapes(n, g, batch=(1, 33), channels=(8, 769), side=(7, 113))
    flops = torch.where(backward, 4.0, 2.0) * shapes.prod(1)
    law = {"forward:fp32": [-11.0, 0.3, 0.2, 0.25, 0.0], "backward:fp32": [-14.0, 0.7, 0.55, 0.3, 0.9]}
    truth = prior.depthwise_law_seconds(shapes, backward, ["fp32"] * n, law)
    noise = torch.exp(0.4 * torch.randn(n, generator=g, dtype=torch.float64))
    seconds = torch.where(depthwise, truth, flops / (rate * 0.6)) * torch.where(depthwise, noise, 1.0)
    rows = prior_fit.KernelRows(flops, flops / 20, ["fp32"] * n, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["conv"] * n, ["synthetic"] * n, seconds,
                                None, backward, None, depthwise,
                                torch.where(depthwise.unsqueeze(1), shapes, float("nan")))
    fitted_law, on_law = prior_fit.fit_depthwise(rows)
    assert on_law.tolist() == depthwise.tolist()
    for key, true in law.items():
        assert fitted_law[key][1:] == pytest.approx(true[1:], abs=0.06)
        m = depthwise & (backward == key.startswith("backward"))
        priced = prior.depthwise_law_seconds(shapes[m], backward[m], ["fp32"] * int(m.sum()), fitted_law)
        assert float(priced.sum() / seconds[m].sum()) == pytest.approx(1.0, abs=0.08)  # the sum, not the geometric mean
    fitted = prior_fit.fit_device(rows, cpu, steps=600, intensity=False, depthwise=True)
    assert fitted["depthwise"] == fitted_law
    own = prior_fit.device_profile(cpu, fitted)
    dense = prior_fit.take(rows, ~depthwise)
    assert prior_fit.kernel_errors(dense, own)["all"]["median_ape"] < 5
    assert prior_fit.kernel_errors(rows, own)["all"]["median_ape"] < 40  # the depthwise rows' noise is 0.4 in log

    from conftest import py_spec
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    traced = trace_step(StepConfig(py_spec("conv2", c1=16, c2=16, groups=16), Shape(4, None, 48), "fp32"))
    tensors, _ = graph.to_tensors(traced)
    x, x_cat = tensors["x"], tensors["x_cat"]
    conv = torch.nonzero(x_cat[:, 1] == ops.CATEGORIES.index("conv")).flatten()
    read = prior.depthwise_shapes(x, x_cat)[conv]
    assert torch.isnan(read[[0, 3]]).all()  # the dense first convolution, forward and backward
    assert read[1].tolist() == read[2].tolist() == [4.0, 16.0, 48.0 * 48.0, 9.0, 1.0]  # batch, channels, H x W, taps, stride
    with_law, without = prior.node_seconds(x, x_cat, own)[conv], prior.node_seconds(x, x_cat, replace(own, depthwise={}))
    expected = prior.depthwise_law_seconds(read[1:3], x_cat[conv[1:3], 3] == prior.BACKWARD_PHASE, ["fp32"] * 2,
                                           fitted_law)
    torch.testing.assert_close(with_law[1:3], expected.clamp_min(own.launch_floor_s))
    torch.testing.assert_close(with_law[[0, 3]], without[conv][[0, 3]])
    assert not torch.allclose(with_law[1:3], without[conv][1:3])


def test_a_depthwise_law_with_the_stride_finds_the_strided_kernels_slow_path():
    """SYNTHETIC depthwise backward kernels whose stride-2 ones take 5x the time of a stride-1 one of their
    shape (as a bf16 depthwise backward does on the first CPU kind): ``fit_depthwise(stride=True)`` recovers
    the stride's exponent (log2 5) and prices both strides within the noise, while the law without the
    stride (five coefficients, the shipped form) prices the stride-1 kernels too slow and the stride-2 ones
    too fast; ``prior.depthwise_law_seconds`` reads the stride column only for a law that has its term, and
    ``prior.depthwise_shapes`` reads a traced stride-2 depthwise convolution's stride from its features, in
    its forward and its backward."""
    import math

    g = torch.Generator().manual_seed(5)
    n = 3000
    shapes = _depthwise_shapes(n, g, batch=(1, 33), channels=(16, 769), side=(4, 65))
    backward = torch.ones(n, dtype=torch.bool)
    law = {"backward:bf16": [-14.0, 0.7, 0.55, 0.3, 0.9, math.log2(5.0)]}
    truth = prior.depthwise_law_seconds(shapes, backward, ["bf16"] * n, law)
    assert float((truth / prior.depthwise_law_seconds(shapes, backward, ["bf16"] * n,
                                                      {"backward:bf16": law["backward:bf16"][:5]}))
                 [shapes[:, 4] == 2].mean()) == pytest.approx(5.0)
    seconds = truth * torch.exp(0.2 * torch.randn(n, generator=g, dtype=torch.float64))
    flops = 4.0 * shapes[:, :4].prod(1)
    rows = prior_fit.KernelRows(flops, flops / 20, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["conv"] * n, ["synthetic"] * n, seconds,
                                None, backward, None, torch.ones(n, dtype=torch.bool), shapes)
    with_stride, _ = prior_fit.fit_depthwise(rows, stride=True)
    without, _ = prior_fit.fit_depthwise(rows)
    assert len(with_stride["backward:bf16"]) == 6 and len(without["backward:bf16"]) == 5
    assert with_stride["backward:bf16"][5] == pytest.approx(math.log2(5.0), abs=0.05)
    for stride in (1, 2):
        m = shapes[:, 4] == stride
        ratio = {name: float(prior.depthwise_law_seconds(shapes[m], backward[m], ["bf16"] * int(m.sum()), fitted).sum()
                             / seconds[m].sum()) for name, fitted in (("with", with_stride), ("without", without))}
        assert ratio["with"] == pytest.approx(1.0, abs=0.05)
        assert (ratio["without"] > 1.3) if stride == 1 else (ratio["without"] < 0.8)

    from conftest import py_spec
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    traced = trace_step(StepConfig(py_spec("conv2", c1=16, c2=16, groups=16, stride2=2), Shape(4, None, 48), "fp32"))
    tensors, _ = graph.to_tensors(traced)
    read = prior.depthwise_shapes(tensors["x"], tensors["x_cat"])
    depthwise = read[~torch.isnan(read[:, 0])]
    assert depthwise.shape[0] == 2  # its forward and its backward
    assert depthwise.tolist() == [[4.0, 16.0, 48.0 * 48.0, 9.0, 2.0]] * 2


def test_a_floor_under_the_depthwise_law_keeps_it_from_extrapolating_to_rates_no_fitted_kernel_ran():
    """SYNTHETIC depthwise backward kernels that run at a rate rising with their size up to a ceiling (each unit
    of work costs more in a small kernel, the same in every large one), fitted on small kernels only: the law
    alone extrapolates the rise and prices the large kernels far too fast; with ``depthwise_floor`` no kernel is
    priced faster than the fastest fitted one ran (``fit_depthwise_floor``: each key's least seconds per unit of
    ``prior.depthwise_work``), which holds the large ones near their time, leaves the small ones as the law
    prices them, and reaches a fitted profile, ``node_seconds`` and a section's options."""
    cpu = HARDWARE["cpu"]
    g = torch.Generator().manual_seed(7)

    def kernels(n, batch, channels, side):
        shapes = _depthwise_shapes(n, g, batch=batch, channels=channels, side=side)
        work = prior.depthwise_work(shapes)
        per_unit = 2e-9 * torch.clamp(1e6 / work, min=1.0) ** 0.5  # faster per unit up to 1e6 units, then flat
        return shapes, work, work * per_unit * torch.exp(0.05 * torch.randn(n, generator=g, dtype=torch.float64))

    shapes, work, seconds = kernels(3000, (1, 5), (16, 65), (4, 17))
    n = len(seconds)
    backward = torch.ones(n, dtype=torch.bool)
    flops = 4.0 * work
    rows = prior_fit.KernelRows(flops, flops / 20, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["conv"] * n, ["synthetic"] * n, seconds,
                                None, backward, None, torch.ones(n, dtype=torch.bool), shapes)
    law, _ = prior_fit.fit_depthwise(rows, stride=True)
    floor = prior_fit.fit_depthwise_floor(rows, law)
    assert floor == {"backward:bf16": pytest.approx(float((seconds / work).min()))}
    assert prior_fit.fit_depthwise_floor(rows, {}) == {}
    big_shapes, big_work, big_seconds = kernels(500, (8, 17), (128, 257), (64, 97))
    assert float(big_work.min()) > float(work.max())  # every one beyond the fitted sizes
    ones = torch.ones(len(big_seconds), dtype=torch.bool)
    alone = prior.depthwise_law_seconds(big_shapes, ones, ["bf16"] * len(ones), law)
    floored = prior.depthwise_law_seconds(big_shapes, ones, ["bf16"] * len(ones), law, floor)
    assert torch.equal(floored, torch.maximum(alone, big_work * floor["backward:bf16"]))
    assert float(alone.sum() / big_seconds.sum()) < 0.7  # the law alone: too fast out there
    assert float(floored.sum() / big_seconds.sum()) == pytest.approx(1.0, abs=0.2)
    small = prior.depthwise_law_seconds(shapes, backward, ["bf16"] * n, law, floor)
    unchanged = torch.isclose(small, prior.depthwise_law_seconds(shapes, backward, ["bf16"] * n, law))
    assert float(unchanged.double().mean()) > 0.5  # within the fitted sizes the law mostly answers alone
    # other keys and dtypes: no floor
    assert torch.isnan(prior.depthwise_law_seconds(big_shapes, ones, ["fp32"] * len(ones), law, floor)).all()

    fitted = prior_fit.fit_device(rows, cpu, steps=50, intensity=False, depthwise=True, depthwise_stride=True,
                                  depthwise_floor=True)
    assert fitted["depthwise_floor"] == floor
    own = prior_fit.device_profile(cpu, fitted)
    assert own.depthwise_floor == floor
    assert prior_fit.section_options({"depthwise_floor": floor})["depthwise_floor"] is True
    assert prior_fit.section_options({})["depthwise_floor"] is False
    assert "depthwise_floor" not in prior_fit.fit_device(rows, cpu, steps=50, intensity=False, depthwise=True)

    from conftest import py_spec
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    traced = trace_step(StepConfig(py_spec("conv2", c1=16, c2=16, groups=16), Shape(4, None, 48), "bf16"))
    tensors, _ = graph.to_tensors(traced)
    x, x_cat = tensors["x"], tensors["x_cat"]
    read = prior.depthwise_shapes(x, x_cat)
    back = (~torch.isnan(read[:, 0])) & (x_cat[:, 3] == prior.BACKWARD_PHASE)
    high = replace(own, depthwise_floor={"backward:bf16": 1.0})  # a floor far above the law: it answers
    assert prior.node_seconds(x, x_cat, high)[back].tolist() == pytest.approx(
        prior.depthwise_work(read[back]).tolist())


def _synthetic_probes(law: dict, layout: str = "channels_last") -> tuple:
    """SYNTHETIC depthwise probe rows (``depthwise_table.measure``'s form) on its grid, their seconds from a
    power law per direction: what a table must give back at and between its points."""
    from gnn_ptp import depthwise_table

    grid = depthwise_table.GRID
    rows = []
    for b in grid["batch_size"]:
        for c in grid["channels"]:
            for h in grid["image_size"]:
                for k in grid["kernel"]:
                    shape = torch.tensor([[b, c, h * h, k * k]], dtype=torch.float64)
                    s = {d: float(prior.depthwise_law_seconds(shape, torch.tensor([d == "backward"]), ["fp32"], law)[0])
                         for d in ("forward", "backward")}
                    rows.append({"precision": "fp32", "layout": layout, "batch_size": b, "channels": c,
                                 "image_size": h, "taps": k * k, "forward_s": s["forward"], "backward_s": s["backward"]})
    return tuple(rows)


def test_a_depthwise_probe_table_interpolates_between_its_points():
    """``depthwise_table.Table``: multilinear in log time over log batch, channels, pixels and taps, so on
    SYNTHETIC probes that follow a power law it gives the law back exactly at the grid's points and between
    them, clamps beyond its edges, and has nothing for a dtype or layout it was not measured in; a grid with
    a hole is refused."""
    from gnn_ptp import depthwise_table

    law = {"forward:fp32": [-11.0, 0.3, 0.2, 0.25, 0.1], "backward:fp32": [-14.0, 0.7, 0.55, 0.3, 0.9]}
    rows = _synthetic_probes(law)
    table = depthwise_table.Table(rows)
    inside = torch.tensor([[2, 64, 1, 9], [8, 1024, 256, 49], [4, 300, 20, 16], [3, 700, 100, 30]], dtype=torch.float64)
    for backward in (False, True):
        expected = prior.depthwise_law_seconds(inside, torch.tensor([backward] * 4), ["fp32"] * 4, law)
        torch.testing.assert_close(table.seconds("fp32", backward, "channels_last", inside), expected)
    beyond = torch.tensor([[64, 4096, 4096, 49]], dtype=torch.float64)
    edge = torch.tensor([[8, 1024, 256, 49]], dtype=torch.float64)
    torch.testing.assert_close(table.seconds("fp32", True, "channels_last", beyond),
                               table.seconds("fp32", True, "channels_last", edge))
    assert torch.isnan(table.seconds("bf16", True, "channels_last", inside)).all()
    assert torch.isnan(table.seconds("fp32", True, "contiguous", inside)).all()
    with pytest.raises(ValueError, match="not full"):
        depthwise_table.Table(rows[1:])


def test_depthwise_probes_measure_rows_a_table_reads():
    """``depthwise_table.measure`` on a one-shape grid (real timings, one thread): a row per dtype and layout
    with positive forward and backward seconds, in the form ``Table`` and a descriptor store, the caller's
    thread count restored; a channels-last input is one torch reads so (``ops.channels_last_strides``)."""
    from gnn_ptp import depthwise_table

    grid = {"batch_size": (2,), "channels": (8,), "image_size": (3,), "kernel": (3,)}
    threads = torch.get_num_threads()
    rows = depthwise_table.measure(depthwise_table.LAYOUTS, dtypes=("fp32",), grid=grid, threads=1)
    assert torch.get_num_threads() == threads  # the caller's thread count is put back
    assert [(r["layout"], r["precision"], r["taps"]) for r in rows] == [("contiguous", "fp32", 9),
                                                                        ("channels_last", "fp32", 9)]
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in rows)
    table = depthwise_table.Table(rows)
    shape = torch.tensor([[2, 8, 9, 9]], dtype=torch.float64)
    assert float(table.seconds("fp32", True, "channels_last", shape)[0]) == pytest.approx(rows[1]["backward_s"])
    x = torch.zeros(2, 3, 3, 8).permute(0, 3, 1, 2)
    assert ops.channels_last_strides(tuple(x.shape), x.stride())
    assert "torch" in depthwise_table.provenance()


def test_the_depthwise_probe_command_writes_rows_that_name_their_machine_and_never_overwrites(tmp_path, capsys):
    """``python -m gnn_ptp.depthwise_table`` (the GPU loan's probe step; here on the CPU, on its two-point
    grid, one dtype and layout): a file with the rows a ``Table`` reads and where they were measured (hardware,
    driver, CUDA and torch versions, the date), whole grids only within ``--budget-s``; an existing file is
    refused, as is a dtype it cannot time or a GPU where there is none, each in one line (``UserError``)."""
    import json

    from gnn_ptp import depthwise_table
    from gnn_ptp.errors import UserError

    out = tmp_path / "probes.json"
    depthwise_table.main(["--device", "cpu", "--small", "--dtypes", "fp32", "--layouts", "channels_last",
                          "--out", str(out)])
    stored = json.loads(out.read_text())
    assert {"hardware", "device_name", "driver", "cuda", "torch", "date", "rows"} <= set(stored)
    assert stored["hardware"] == "cpu" and stored["torch"] == torch.__version__
    assert len(stored["rows"]) == 16  # two points on each of the four axes
    assert {r["layout"] for r in stored["rows"]} == {"channels_last"}
    depthwise_table.Table(stored["rows"])  # a full grid
    budget = tmp_path / "budget.json"  # the budget ends after the grid it is spent in: the others are left out
    depthwise_table.main(["--device", "cpu", "--small", "--dtypes", "fp32,bf16", "--layouts", "channels_last",
                          "--budget-s", "0.001", "--out", str(budget)])
    assert {r["precision"] for r in json.loads(budget.read_text())["rows"]} == {"fp32"}
    assert "not measured channels_last bf16" in capsys.readouterr().err
    with pytest.raises(UserError, match="never overwritten"):
        depthwise_table.main(["--device", "cpu", "--out", str(out)])
    with pytest.raises(UserError, match="--dtypes fp8"):
        depthwise_table.main(["--device", "cpu", "--dtypes", "fp8", "--out", str(tmp_path / "b.json")])
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA device"):
            depthwise_table.main(["--out", str(tmp_path / "c.json")])


def test_a_gpu_section_fitted_with_probes_reads_the_gpu_s_probe_file_or_its_fit_gpu_s(tmp_path, monkeypatch):
    """A GPU has no descriptor: its probes are a file (``depthwise_table.GPU_PROBE_DIR/<gpu>.json``). A GPU
    section that says ``depthwise_probes`` gives its profile the GPU's own probes, else those of the GPU it
    was fitted on as measured (the H100 priced from the H200's), else none; a section without the flag
    never reads them. SYNTHETIC probe files."""
    import json

    from gnn_ptp import depthwise_table

    law = {"forward:fp32": (-12.0, 1.0, 1.0, 1.0, 0.5), "backward:fp32": (-10.0, 1.0, 1.0, 1.0, 0.5)}
    rows = [dict(r) for r in _synthetic_probes(law)]
    monkeypatch.setattr(depthwise_table, "GPU_PROBE_DIR", tmp_path)
    depthwise_table.gpu_probe_rows.cache_clear()
    try:
        (tmp_path / "h200.json").write_text(json.dumps({"hardware": "h200", "rows": rows}))
        section = {"gemm": {}, "fitted_on": "h200", "depthwise_probes": True}
        h100 = prior.profile_from_dict(HARDWARE["h100"], section)
        assert h100.depthwise_probes and len(h100.hardware.depthwise_probe_s) == len(rows)  # the H200's
        assert h100.hardware == HARDWARE["h100"]  # the same hardware: probes are not its identity
        assert not prior.profile_from_dict(HARDWARE["h100"], {**section, "depthwise_probes": False}
                                           ).hardware.depthwise_probe_s
        own = [{**r, "forward_s": 2 * r["forward_s"]} for r in rows]
        (tmp_path / "h100.json").write_text(json.dumps({"hardware": "h100", "rows": own}))
        depthwise_table.gpu_probe_rows.cache_clear()
        h100 = prior.profile_from_dict(HARDWARE["h100"], section)
        assert h100.hardware.depthwise_probe_s[0]["forward_s"] == own[0]["forward_s"]
        assert not depthwise_table.gpu_probe_rows("a100")
    finally:
        depthwise_table.gpu_probe_rows.cache_clear()


def test_channels_last_depthwise_convolutions_are_priced_from_the_hardware_s_probes_where_fitted_so(monkeypatch):
    """SYNTHETIC depthwise kernels, a third channels-last (``ops.CHANNELS_LAST`` in ``gemm_layout``) whose
    time follows a law of their own, and the same law as SYNTHETIC probes on the hardware
    (``Hardware.depthwise_probe_s``): ``fit_device(depthwise_probes=True)`` prices the channels-last ones from
    the probes and fits the depthwise law to the others alone (it recovers their exponents, which a law fitted
    to all of them does not; so does ``prior_fit.fit``, which fits the law before the curves), marks its
    result so (``device_profile``, ``section_options``), and
    ``prior.node_seconds`` prices a traced channels-last depthwise convolution from the probes while a
    contiguous one, a profile not fitted so and hardware without probes keep the law."""
    from dataclasses import replace as dc_replace

    g = torch.Generator().manual_seed(5)
    n = 3000
    backward = torch.rand(n, generator=g) < 0.5
    cl = torch.rand(n, generator=g) < 0.33
    shapes = _depthwise_shapes(n, g, batch=(2, 9), channels=(64, 1025), side=(1, 17))
    plain = {"forward:fp32": [-11.0, 0.3, 0.2, 0.25, 0.0], "backward:fp32": [-14.0, 0.7, 0.55, 0.3, 0.9]}
    other = {"forward:fp32": [-10.0, 0.1, 0.6, 0.1, 0.3], "backward:fp32": [-12.0, 0.5, 0.9, -0.1, 1.1]}
    seconds = torch.where(cl, prior.depthwise_law_seconds(shapes, backward, ["fp32"] * n, other),
                          prior.depthwise_law_seconds(shapes, backward, ["fp32"] * n, plain))
    seconds = seconds * torch.exp(0.1 * torch.randn(n, generator=g, dtype=torch.float64))
    flops = torch.where(backward, 4.0, 2.0) * shapes.prod(1)
    depthwise = torch.rand(n, generator=g) < 0.7  # the rest dense, on a FLOPs curve
    cpu = HARDWARE["cpu"]
    seconds = torch.where(depthwise, seconds, flops / (cpu.flops_rate("fp32", False, gemm=True) * 0.6))
    rows = prior_fit.KernelRows(flops, flops / 20, ["fp32"] * n, torch.ones(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["conv"] * n, ["synthetic"] * n, seconds,
                                None, backward, None, depthwise,
                                torch.where(depthwise.unsqueeze(1), shapes, float("nan")),
                                layout=torch.where(cl, ops.CHANNELS_LAST, 0))
    probed_hw = dc_replace(cpu, depthwise_probe_s=_synthetic_probes(other))
    fitted = prior_fit.fit_device(rows, probed_hw, steps=50, depthwise=True, depthwise_probes=True)
    assert fitted["depthwise_probes"] is True
    for key in plain:
        assert fitted["depthwise"][key][1:] == pytest.approx(plain[key][1:], abs=0.05)
    pooled = prior_fit.fit_device(rows, cpu, steps=50, depthwise=True, depthwise_probes=True)  # no probes
    assert "depthwise_probes" not in pooled
    profile = prior_fit.device_profile(probed_hw, fitted)
    assert profile.depthwise_probes and prior_fit.section_options(fitted)["depthwise_probes"]
    m = depthwise & cl & backward
    priced = prior_fit._prior_seconds(prior_fit.take(rows, m), profile)
    assert float(priced.sum() / seconds[m].sum()) == pytest.approx(1.0, abs=0.03)
    by_law = prior_fit._prior_seconds(prior_fit.take(rows, m), prior_fit.device_profile(cpu, pooled))
    assert abs(float(by_law.sum() / seconds[m].sum()) - 1) > 0.2  # one law for both misprices them
    # both stages (prior_fit.fit, what calibrate_prior and the protocol's refits call) leave them out of the law too
    monkeypatch.setattr(prior_fit, "kernel_rows", lambda samples, seconds: rows)
    monkeypatch.setattr(prior_fit, "fit_host", lambda samples, profile: ([0.0] * 3, [0.0] * 3, {}))
    both, _, _ = prior_fit.fit([], {}, probed_hw, steps=50, depthwise=True, depthwise_probes=True)
    assert both["depthwise_probes"] is True
    for key in plain:
        assert both["depthwise"][key][1:] == pytest.approx(plain[key][1:], abs=0.05)

    from conftest import py_spec
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    for channels_last in (0, 1):
        traced = trace_step(StepConfig(py_spec("conv2", c1=96, c2=96, k=7, padding=3, groups=96,
                                               channels_last=channels_last), Shape(4, None, 8), "fp32", target="cpu"))
        t, _ = graph.to_tensors(traced)
        shape = prior.depthwise_shapes(t["x"], t["x_cat"])
        node = torch.nonzero(~torch.isnan(shape[:, 0]) & (t["x_cat"][:, 3] == prior.BACKWARD_PHASE)).flatten()
        assert node.numel() == 1
        by = {name: prior.node_seconds(t["x"], t["x_cat"], p, layout=t["gemm_layout"])[node]
              for name, p in (("probes", profile), ("not fitted so", dc_replace(profile, depthwise_probes=False)),
                              ("no probes", dc_replace(profile, hardware=cpu)))}
        law = prior.depthwise_law_seconds(shape[node], torch.tensor([True]), ["fp32"], other if channels_last
                                          else fitted["depthwise"]).clamp_min(profile.launch_floor_s)
        torch.testing.assert_close(by["probes"], law)
        torch.testing.assert_close(by["not fitted so"], by["no probes"])
        assert channels_last == (not torch.allclose(by["probes"], by["not fitted so"]))


def test_grouped_convolution_curves_with_few_kernels_fall_back_in_lookup_order():
    """A grouped convolution's group with fewer than MIN_GROUP_ROWS kernels joins the next curve
    ``prior.gemm_keys`` looks up (its forward's, then the convolution's), so the fit and the lookup agree."""
    from collections import Counter

    counts = Counter({"conv:bf16": 500, "conv_grouped:bf16": 300, "conv_grouped_backward:bf16": 3,
                      "conv_grouped:fp32": 2, "conv_grouped_backward:fp32": 2})
    assert prior_fit._fallback("conv_grouped_backward:bf16", counts) == "conv_grouped:bf16"
    assert prior_fit._fallback("conv_grouped_backward:fp32", counts) == "fp32"  # no conv:fp32 either
    counts["conv:fp32"] = 400
    assert prior_fit._fallback("conv_grouped:fp32", counts) == "conv:fp32"
    assert prior.gemm_keys("bf16", prior.GROUPED_CONV, True)[:4] == (
        "conv_grouped_backward:bf16", "conv_grouped:bf16", "conv_backward:bf16", "conv:bf16")


def test_a_backward_curve_with_few_kernels_is_fitted_as_its_forward_s():
    """Fewer than MIN_GROUP_ROWS backward kernels of a category: they join their forward curve (the one
    ``Profile.gemm_curve`` falls back to), not the dtype's pooled curve."""
    from collections import Counter

    counts = Counter({"conv:bf16": 500, "conv_backward:bf16": 3, "attention_backward:fp32": 2})
    assert prior_fit._fallback("conv_backward:bf16", counts) == "conv:bf16"
    assert prior_fit._fallback("attention_backward:fp32", counts) == "fp32"
    assert prior_fit._fallback("matmul:bf16", counts) == "bf16"


def test_dense_convolutions_can_ramp_with_their_implicit_gemm_intensity():
    """``prior.conv_gemm_intensity`` reads a traced dense convolution's implicit GEMM (M output positions,
    K = input channels x taps, C output channels) from its features alone, NaN for other nodes and grouped
    convolutions; on SYNTHETIC convolutions whose time ramps with that intensity (1x1, 3x3 and 7x7 ones,
    whose tensor-byte intensities differ by their taps), a fit with ``conv_intensity="gemm"`` recovers
    them and one by tensor bytes does not; the profile carries the choice, and ``prior.node_seconds``
    prices a traced convolution by it."""
    from conftest import py_spec
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    def traced(groups=1, precision="fp32"):
        step = trace_step(StepConfig(py_spec("conv2", c1=32, c2=64, groups=groups), Shape(4, None, 16), precision))
        tensors, _ = graph.to_tensors(step)
        return tensors["x"], tensors["x_cat"], torch.nonzero(tensors["x_cat"][:, 1] == ops.CATEGORIES.index("conv")).flatten()

    def gemm(m, k, c, element):
        return 2 * m * k * c / (element * (m * k + k * c + m * c))

    x, x_cat, conv = traced()
    read = prior.conv_gemm_intensity(x, x_cat)
    assert x_cat[conv, 3].tolist() == [0, 0, 1, 1]  # forward 1, forward 2, backward 2, backward 1
    m = 4 * 16 * 16  # batch x height x width of both convolutions' outputs
    assert read[conv[0]].item() == pytest.approx(gemm(m, 3 * 9, 32, 4), rel=1e-6)
    assert read[conv[1]].item() == pytest.approx(gemm(m, 32 * 9, 64, 4), rel=1e-6)
    assert read[conv[2]].item() == pytest.approx(read[conv[1]].item(), rel=1e-6)  # its backward: the same sides
    others = torch.ones(x.shape[0], dtype=torch.bool)
    others[conv] = False
    assert torch.isnan(read[others]).all()
    xb, xb_cat, convb = traced(precision="bf16")
    assert prior.conv_gemm_intensity(xb, xb_cat)[convb[1]].item() == pytest.approx(gemm(m, 32 * 9, 64, 2), rel=1e-6)
    xg, xg_cat, convg = traced(groups=32)  # depthwise second convolution: not a dense GEMM
    assert torch.isnan(prior.conv_gemm_intensity(xg, xg_cat)[convg[1:3]]).all()

    # SYNTHETIC kernels: bf16 convolutions at 0.7 of the tensor-core peak, ramped by their GEMM intensity
    g = torch.Generator().manual_seed(5)
    n = 3000
    positions = 2.0 ** torch.randint(12, 19, (n,), generator=g).double()  # kernels of 0.5 us and more
    cin = 2.0 ** torch.randint(6, 11, (n,), generator=g).double()
    cout = 2.0 ** torch.randint(6, 11, (n,), generator=g).double()
    taps = torch.tensor([1.0, 9.0, 49.0], dtype=torch.float64)[torch.randint(0, 3, (n,), generator=g)]
    k = cin * taps
    flops = 2 * positions * k * cout
    moved = 2.0 * (positions * cin + k * cout + positions * cout)  # the tensors' bytes: the input once
    intensity = gemm(positions, k, cout, 2.0)
    rate = H200.flops_rate("bf16", True, gemm=True)
    true_curve = prior.Curve(0.7, 1e3, 1.0, intensity_half=150.0, intensity_slope=1.5)
    noise = torch.exp(0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    seconds = flops / (rate * true_curve(flops, intensity)) * noise
    rows = prior_fit.KernelRows(flops, moved, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.ones(n, dtype=torch.bool), ["conv"] * n, ["synthetic"] * n, seconds,
                                conv_gemm=intensity)
    by_gemm = prior_fit.fit_device(rows, H200, steps=1500, conv_intensity="gemm")
    by_tensor = prior_fit.fit_device(rows, H200, steps=1500)
    assert by_gemm["conv_intensity"] == "gemm" and "conv_intensity" not in by_tensor
    own, other = prior_fit.device_profile(H200, by_gemm), prior_fit.device_profile(H200, by_tensor)
    assert own.conv_intensity == "gemm" and other.conv_intensity == "tensor"
    assert prior_fit.kernel_errors(rows, own)["all"]["median_ape"] < 5
    assert prior_fit.kernel_errors(rows, other)["all"]["median_ape"] > 15

    # a traced convolution priced by the profile's choice of intensity
    curve = own.gemm_curve("bf16", "conv")
    flops_b = prior._unlog(xb[convb[1], 0])
    expected = flops_b / (rate * curve(flops_b.reshape(1), prior.conv_gemm_intensity(xb, xb_cat)[convb[1]].reshape(1)))
    priced = prior.node_seconds(xb, xb_cat, replace(own, launch_floor_s=0.0))[convb[1]]
    moved_b = prior._unlog(xb[convb[1], 1]) + prior._unlog(xb[convb[1], 2])
    memory_b = moved_b / (H200.memory_bandwidth_Bps * own.memory_curve("conv", "bf16")(moved_b.reshape(1)))
    assert priced.item() == pytest.approx(max(expected.item(), memory_b.item()), rel=1e-6)


def test_batch_norms_can_ramp_with_their_channels():
    """``prior.batch_norm_channels`` reads a traced batch norm's channels (forward and backward), NaN for
    other nodes; on SYNTHETIC batch norms whose time is their bytes at the bandwidth over a channel ramp
    (a GPU's one thread block per channel), a fit with ``channel_ramp`` recovers it and one without does not;
    the profile carries the ramp and ``prior.node_seconds`` prices a traced batch norm by it."""
    from conftest import py_spec
    from gnn_ptp import graph
    from gnn_ptp.spec import Shape
    from gnn_ptp.trace import StepConfig, trace_step

    step = trace_step(StepConfig(py_spec("conv_bn", channels=24), Shape(4, None, 16), "fp32", target="cuda"))
    tensors, _ = graph.to_tensors(step)
    x, x_cat = tensors["x"], tensors["x_cat"]
    bn = (x_cat[:, 0] == ops.OP_ID["batch_norm"]) | (x_cat[:, 0] == ops.OP_ID["batch_norm_backward"])
    assert int(bn.sum()) == 2
    read = prior.batch_norm_channels(x, x_cat)
    assert read[bn].tolist() == [24.0, 24.0]
    assert torch.isnan(read[~bn]).all()

    g = torch.Generator().manual_seed(7)
    n = 3000
    channels = 2.0 ** torch.randint(3, 11, (n,), generator=g).double()
    per_channel = 2.0 ** torch.randint(12, 20, (n,), generator=g).double()
    backward = torch.rand(n, generator=g) < 0.5
    moved = 4.0 * channels * per_channel * torch.where(backward, 3.0, 2.0)
    ramp = {"batch_norm": (100.0, 1.0), "batch_norm_backward": (150.0, 1.2)}
    noise = torch.exp(0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    seconds = (moved / (H200.memory_bandwidth_Bps * 0.8) * prior.channel_ramp_factor(channels, backward, ramp)
               * noise)
    rows = prior_fit.KernelRows(moved / 8, moved, ["fp32"] * n, torch.zeros(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), ["norm"] * n, ["synthetic"] * n, seconds,
                                None, backward, bn_channels=channels)
    with_ramp = prior_fit.fit_device(rows, H200, steps=2000, intensity=False, channel_ramp=True)
    without = prior_fit.fit_device(rows, H200, steps=2000, intensity=False)
    assert set(with_ramp["channel_ramp"]) == set(prior.BATCH_NORM_OPS) and "channel_ramp" not in without
    own, other = prior_fit.device_profile(H200, with_ramp), prior_fit.device_profile(H200, without)
    assert own.channel_ramp and not other.channel_ramp
    assert prior_fit.kernel_errors(rows, own)["all"]["median_ape"] < 6
    assert prior_fit.kernel_errors(rows, other)["all"]["median_ape"] > 20

    plain = prior.node_seconds(x, x_cat, replace(own, channel_ramp={}, launch_floor_s=0.0))
    ramped = prior.node_seconds(x, x_cat, replace(own, launch_floor_s=0.0))
    factor = prior.channel_ramp_factor(read, x_cat[:, 3] == prior.BACKWARD_PHASE, own.channel_ramp)
    torch.testing.assert_close(ramped[bn], plain[bn] * factor[bn])
    torch.testing.assert_close(ramped[~bn], plain[~bn])
    assert bool((factor[bn] > 1.5).all())  # 24 channels: well below either fitted half


def test_kernel_classes_give_the_optimizer_phase_random_and_norms_their_own_curves():
    """SYNTHETIC CPU rows priced by a known profile in which the optimizer phase's element-wise kernels
    stream at twice the pooled bandwidth curve's fraction, the random generator's kernels run at a tenth of
    the vector curve's and the norms at half the bandwidth: with the pooled curves the fit cannot price all
    three (the CPU kinds' shipped form); with ``optimizer_memory``, ``own_vector=("random",)`` and
    ``own_memory=("norm",)`` it recovers each, and a node of the optimizer phase is priced by its own curve
    (``prior.OPTIMIZER_MEMORY``) only there."""
    g = torch.Generator().manual_seed(11)
    n = 3000
    # 0 element-wise, 1 its optimizer twin, 2 random, 3 norm (memory-bound), 4 compute-bound element-wise
    kind = torch.randint(0, 5, (n,), generator=g)
    moved = 10 ** (5 + 3 * torch.rand(n, generator=g, dtype=torch.float64))  # above the launch floor
    flops = torch.where(kind == 2, moved * 2.0, torch.where(kind == 4, moved * 50.0, moved / 1e4))
    category = [("elementwise", "elementwise", "random", "norm", "elementwise")[k] for k in kind.tolist()]
    rows = prior_fit.KernelRows(flops, moved, ["fp32"] * n, torch.zeros(n, dtype=torch.bool),
                                torch.zeros(n, dtype=torch.bool), category, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64), optimizer=kind == 1)
    truth_section = {**CPU_TRUE, "vector_fraction": {"random": 0.05},
                     "memory_fraction": {prior.OPTIMIZER_MEMORY: 8.0, "norm": 2.0}}
    truth = prior.profile_from_dict(CPU, truth_section)
    noise = torch.exp(0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    rows.seconds = prior_fit._prior_seconds(rows, truth) * noise

    kw = dict(steps=1500, intensity=False, vector_by_category=False, memory_by_category=False)
    pooled = prior_fit.kernel_errors(rows, prior_fit.device_profile(CPU, prior_fit.fit_device(rows, CPU, **kw)))
    fitted = prior_fit.fit_device(rows, CPU, optimizer_memory=True, own_vector=("random",), own_memory=("norm",),
                                  **kw)
    assert set(fitted["memory_fraction"]) == {prior.OPTIMIZER_MEMORY, "norm"}
    assert set(fitted["vector_fraction"]) == {"random"}
    own = prior_fit.kernel_errors(rows, prior_fit.device_profile(CPU, fitted))
    for category in ("random", "norm"):
        assert own[category]["median_ape"] < 8 < pooled[category]["median_ape"], category
    without = prior_fit.fit_device(rows, CPU, own_vector=("random",), own_memory=("norm",), **kw)

    def optimizer_error(fitted):  # median APE of the optimizer phase's kernels
        part = prior_fit.take(rows, kind == 1)
        return float((prior_fit._prior_seconds(part, prior_fit.device_profile(CPU, fitted)) / part.seconds - 1)
                     .abs().median())
    assert optimizer_error(fitted) < 0.1 < 0.25 < optimizer_error(without)
    # a fit that gives every (category, dtype) its own curve gives the optimizer phase's pairs theirs
    by_pair = prior_fit.fit_device(rows, CPU, optimizer_memory=True, own_vector=("random",),
                                   **{**kw, "memory_by_category": True})
    assert set(by_pair["memory_fraction"]) == {f"{prior.OPTIMIZER_MEMORY}:elementwise:fp32", "elementwise:fp32",
                                               "norm:fp32", "random:fp32"}
    assert optimizer_error(by_pair) < 0.1

    x = torch.zeros(2, NODE_FEATURES)  # one element-wise node in the forward phase, one in the optimizer's
    x[:, 1] = x[:, 2] = math.log2(1 + 5e5)
    x_cat = torch.zeros(2, 4, dtype=torch.long)
    x_cat[:, 1] = ops.CATEGORIES.index("elementwise")
    x_cat[1, 3] = prior.OPTIMIZER_PHASE
    seconds = prior.node_seconds(x, x_cat, truth)
    assert seconds[0] / seconds[1] == pytest.approx(2.0, rel=1e-6)
    plain = prior.node_seconds(x, x_cat, prior.profile_from_dict(CPU, CPU_TRUE))
    assert plain[0] == pytest.approx(plain[1]) and plain[0] == pytest.approx(seconds[0])


def test_gemms_priced_at_their_layout_s_ceiling_where_a_fit_has_layouts():
    """SYNTHETIC bf16 GEMMs of a CPU without a fast bf16 path: the same sizes run 7x (nt) and 18x (tn) faster
    than nn, as the fourth kind's descriptor measured. One curve per dtype cannot price all three; a fit with
    ``gemm_layouts`` (each GEMM's peak its layout's ceiling) can. A profile fitted so prices a node by its
    layout and a hardware without layout rates is unchanged; a section without the flag keeps its digest."""
    ratio = {"bf16:nn": 1.0, "bf16:nt": 7.0, "bf16:tn": 18.0, "bf16:tt": 1.0}
    hw = replace(CPU, gemm_layout_ratio=ratio)
    g = torch.Generator().manual_seed(5)
    n = 3000
    layout = torch.randint(1, 4, (n,), generator=g)  # nn, nt, tn
    flops = 10 ** (6 + 4 * torch.rand(n, generator=g, dtype=torch.float64))
    rows = prior_fit.KernelRows(flops, flops ** (2 / 3) * 6, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.ones(n, dtype=torch.bool), ["matmul"] * n, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64), layout=layout)
    truth = replace(prior.profile_from_dict(hw, CPU_TRUE), gemm_layouts=True)
    rows.seconds = prior_fit._prior_seconds(rows, truth) * torch.exp(0.05 * torch.randn(n, generator=g,
                                                                                         dtype=torch.float64))
    with_layouts = prior_fit.fit_device(rows, hw, steps=1500, intensity=False, gemm_layouts=True)
    without = prior_fit.fit_device(rows, hw, steps=1500, intensity=False)
    assert with_layouts["gemm_layouts"] and "gemm_layouts" not in without
    good = prior_fit.kernel_errors(rows, prior_fit.device_profile(hw, with_layouts))["all"]["median_ape"]
    bad = prior_fit.kernel_errors(rows, prior_fit.device_profile(hw, without))["all"]["median_ape"]
    assert good < 8 and bad > 50

    profile = prior_fit.device_profile(hw, with_layouts)
    x = torch.zeros(3, NODE_FEATURES)
    x[:, 0] = math.log2(1 + 1e8)
    x[:, prior.TC_COLUMN] = 1.0
    x_cat = torch.tensor([[ops.OP_ID["mm"], ops.CATEGORIES.index("matmul"), ops.DTYPE_ID["bf16"], 0]] * 3)
    codes = torch.tensor([ops.GEMM_LAYOUTS.index(k) for k in ("nn", "nt", "tn")])
    priced = prior.node_seconds(x, x_cat, profile, layout=codes)
    assert (priced[0] / priced[1]).item() == pytest.approx(7.0, rel=1e-6)
    assert (priced[0] / priced[2]).item() == pytest.approx(18.0, rel=1e-6)
    unknown = prior.node_seconds(x, x_cat, profile)  # a graph cached before layouts: every GEMM at nn
    assert torch.allclose(unknown, priced[:1].expand(3))
    plain = prior.node_seconds(x, x_cat, replace(profile, hardware=CPU), layout=codes)  # no layout rates
    assert torch.allclose(plain, plain[:1].expand(3))
    assert prior.profile_from_dict(hw, {**CPU_TRUE, "gemm_layouts": True}).gemm_layouts
    assert not prior.profile_from_dict(hw, CPU_TRUE).gemm_layouts


def _layout_matmul_rows(profile, seed: int, decades: int, n: int = 3000):
    """SYNTHETIC bf16 matmul kernels of random layouts (nn, nt, tn) and 1e6 to 1e(6 + ``decades``) FLOPs,
    timed by ``profile`` with 5 % log-normal noise."""
    g = torch.Generator().manual_seed(seed)
    layout = torch.randint(1, 4, (n,), generator=g)
    flops = 10 ** (6 + decades * torch.rand(n, generator=g, dtype=torch.float64))
    rows = prior_fit.KernelRows(flops, flops ** (2 / 3) * 6, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.ones(n, dtype=torch.bool), ["matmul"] * n, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64), layout=layout)
    rows.seconds = prior_fit._prior_seconds(rows, profile) * torch.exp(
        0.05 * torch.randn(n, generator=g, dtype=torch.float64))
    return rows


def test_a_layout_s_own_curve_follows_its_own_size_ramp():
    """SYNTHETIC bf16 matmuls whose three layouts grow with size differently (nn slowing down, nt and tn
    ramping up): a ratio per layout on one shared ramp cannot price them, a curve per layout
    (``layout_curves``: "matmul@nt:bf16") can; a node is priced by its layout's curve, one of unknown
    layout by the dtype's."""
    truth = {"gemm": {"matmul@nn:bf16": {"peak_fraction": 0.02, "half_size": 1e7, "slope": -0.5},
                      "matmul@nt:bf16": {"peak_fraction": 0.07, "half_size": 3e7, "slope": 1.0},
                      "matmul@tn:bf16": {"peak_fraction": 0.18, "half_size": 1e8, "slope": 1.5},
                      "matmul:bf16": {"peak_fraction": 0.01}},
             "vector": {"peak_fraction": 1.0}, "memory": {"peak_fraction": 100.0}, "launch_floor_s": 1e-6}
    profile = prior.profile_from_dict(CPU, truth)
    assert profile.layout_curves and prior.gemm_keys("bf16", "matmul", False, "tn")[0] == "matmul@tn:bf16"
    rows = _layout_matmul_rows(profile, seed=6, decades=4)
    own = prior_fit.fit_device(rows, CPU, steps=1500, intensity=False, layout_curves=True)
    assert {"matmul@nn:bf16", "matmul@nt:bf16", "matmul@tn:bf16"} <= set(own["gemm"])
    shared = prior_fit.fit_device(rows, replace(CPU, gemm_layout_ratio={"bf16:nt": 7.0, "bf16:tn": 18.0}), steps=1500,
                                  intensity=False, gemm_layouts=True)
    good = prior_fit.kernel_errors(rows, prior_fit.device_profile(CPU, own))["all"]["median_ape"]
    hw = replace(CPU, gemm_layout_ratio={"bf16:nt": 7.0, "bf16:tn": 18.0})
    bad = prior_fit.kernel_errors(rows, prior_fit.device_profile(hw, shared))["all"]["median_ape"]
    assert good < 8 and bad > 2 * good

    fitted = prior_fit.device_profile(CPU, own)
    x = torch.zeros(2, NODE_FEATURES)
    x[:, 0] = math.log2(1 + 1e9)
    x[:, prior.TC_COLUMN] = 1.0
    x_cat = torch.tensor([[ops.OP_ID["mm"], ops.CATEGORIES.index("matmul"), ops.DTYPE_ID["bf16"], 1]] * 2)
    codes = torch.tensor([ops.GEMM_LAYOUTS.index("nn"), ops.GEMM_LAYOUTS.index("tn")])
    priced = prior.node_seconds(x, x_cat, fitted, layout=codes)
    want = prior.node_seconds(x, x_cat, profile, layout=codes)
    assert torch.allclose(priced, want, rtol=0.2)
    assert (priced[0] / priced[1]).item() > 5  # tn far faster than nn at this size


def test_layout_levels_share_one_ramp_and_fit_each_layout_s_own_level():
    """SYNTHETIC bf16 matmuls of three layouts on one size ramp at three levels (0.02, 0.07, 0.18 of the
    peak): fitted with ``layout_levels`` every layout's curve has the shared ramp (the same half size and
    slope) at its own level, prices its kernels, and the section says how it was fitted, for the
    protocol's refits (``section_options``)."""
    ramp = {"half_size": 3e7, "slope": 1.0}
    truth = {"gemm": {"matmul@nn:bf16": {"peak_fraction": 0.02, **ramp},
                      "matmul@nt:bf16": {"peak_fraction": 0.07, **ramp},
                      "matmul@tn:bf16": {"peak_fraction": 0.18, **ramp},
                      "matmul:bf16": {"peak_fraction": 0.05, **ramp}},
             "vector": {"peak_fraction": 1.0}, "memory": {"peak_fraction": 100.0}, "launch_floor_s": 1e-6}
    rows = _layout_matmul_rows(prior.profile_from_dict(CPU, truth), seed=8, decades=3)
    fitted = prior_fit.fit_device(rows, CPU, steps=1500, intensity=False, layout_curves=True, layout_levels=True)
    curves = [fitted["gemm"][f"matmul@{la}:bf16"] for la in ("nn", "nt", "tn")]
    assert fitted["layout_levels"] is True
    assert len({(c["half_size"], c["slope"]) for c in curves}) == 1  # one ramp
    levels = [c["peak_fraction"] for c in curves]
    assert levels[0] < levels[1] < levels[2]
    assert 5 < levels[2] / levels[0] < 14  # 9x in the truth
    assert prior_fit.kernel_errors(rows, prior_fit.device_profile(CPU, fitted))["all"]["median_ape"] < 8
    assert prior_fit.section_options(fitted)["layout_levels"] is True
    assert prior_fit.section_options({"gemm": fitted["gemm"]})["layout_levels"] is False


def test_a_bounded_layout_curve_holds_its_fraction_beyond_the_largest_kernel_it_was_fitted_on():
    """SYNTHETIC tn matmuls of 1e6-1e8 FLOPs on a ramp still rising at 1e8: fitted with
    ``bounded_layout_curves`` the layout's curve records the largest kernel it saw (``Curve.size_max``) and
    prices a 1e11-FLOP one at the fraction it reached there, where the unbounded curve follows its ramp up;
    inside the fitted range both price alike, and the bound survives a section's round trip."""
    truth = {"gemm": {"matmul@tn:bf16": {"peak_fraction": 0.5, "half_size": 1e9, "slope": 0.5},
                      "matmul:bf16": {"peak_fraction": 0.01}},
             "vector": {"peak_fraction": 1.0}, "memory": {"peak_fraction": 100.0}, "launch_floor_s": 1e-6}
    g = torch.Generator().manual_seed(7)
    n = 1500
    flops = 10 ** (6 + 2 * torch.rand(n, generator=g, dtype=torch.float64))
    layout = torch.full((n,), ops.GEMM_LAYOUTS.index("tn"))
    rows = prior_fit.KernelRows(flops, flops ** (2 / 3) * 6, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.ones(n, dtype=torch.bool), ["matmul"] * n, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64), layout=layout)
    rows.seconds = prior_fit._prior_seconds(rows, prior.profile_from_dict(CPU, truth))
    free = prior_fit.fit_device(rows, CPU, steps=800, intensity=False, layout_curves=True)
    held = prior_fit.fit_device(rows, CPU, steps=800, intensity=False, layout_curves=True, bounded_layout_curves=True)
    assert "size_max" not in free["gemm"]["matmul@tn:bf16"]
    assert held["gemm"]["matmul@tn:bf16"]["size_max"] == float(flops.max())
    assert prior_fit.section_options(held)["bounded_layout_curves"]
    free_curve = prior.Curve.from_dict(free["gemm"]["matmul@tn:bf16"])
    held_curve = prior.Curve.from_dict(held["gemm"]["matmul@tn:bf16"])
    inside = torch.tensor([1e7], dtype=torch.float64)
    assert torch.allclose(free_curve(inside), held_curve(inside), rtol=0.05)
    big = torch.tensor([1e11], dtype=torch.float64)
    edge = torch.tensor([float(flops.max())], dtype=torch.float64)
    assert torch.allclose(held_curve(big), held_curve(edge))
    assert free_curve(big).item() > 1.2 * held_curve(big).item()  # the free ramp kept rising


def test_a_capped_matmul_curve_never_prices_a_kernel_faster_than_its_fastest_fitted_one():
    """SYNTHETIC bf16 matmuls of 1e6-1e8 FLOPs on a ramp still rising at 1e8: fitted with ``matmul_cap`` the
    matmul curve records the fastest fraction it gives a fitted kernel (``Curve.fraction_max``) and prices a
    1e11-FLOP one at it, where the free curve climbs its ramp toward a peak fraction above anything fitted;
    inside the fitted range both price alike, and the cap survives a section's round trip
    (``section_options``) and a profile's (``profile_from_dict``)."""
    truth = {"gemm": {"matmul:bf16": {"peak_fraction": 0.5, "half_size": 1e9, "slope": 0.5}},
             "vector": {"peak_fraction": 1.0}, "memory": {"peak_fraction": 100.0}, "launch_floor_s": 1e-6}
    g = torch.Generator().manual_seed(9)
    n = 1500
    flops = 10 ** (6 + 2 * torch.rand(n, generator=g, dtype=torch.float64))
    rows = prior_fit.KernelRows(flops, flops ** (2 / 3) * 6, ["bf16"] * n, torch.ones(n, dtype=torch.bool),
                                torch.ones(n, dtype=torch.bool), ["matmul"] * n, ["synthetic"] * n,
                                torch.zeros(n, dtype=torch.float64))
    rows.seconds = prior_fit._prior_seconds(rows, prior.profile_from_dict(CPU, truth))
    free = prior_fit.fit_device(rows, CPU, steps=800, intensity=False)
    held = prior_fit.fit_device(rows, CPU, steps=800, intensity=False, matmul_cap=True)
    assert "fraction_max" not in free["gemm"]["matmul:bf16"]
    assert not prior_fit.section_options(free)["matmul_cap"]
    assert prior_fit.section_options(held)["matmul_cap"]
    free_curve = prior.Curve.from_dict(free["gemm"]["matmul:bf16"])
    held_curve = prior.Curve.from_dict(held["gemm"]["matmul:bf16"])
    top = held["gemm"]["matmul:bf16"]["fraction_max"]
    assert top == pytest.approx(float(free_curve(flops).max()), rel=0.05)  # the fastest fitted kernel's
    inside = torch.tensor([1e7], dtype=torch.float64)
    assert torch.allclose(free_curve(inside), held_curve(inside), rtol=0.05)
    beyond = torch.tensor([1e11], dtype=torch.float64)
    assert float(held_curve(beyond)) == pytest.approx(top)
    assert float(free_curve(beyond)) > 1.2 * top  # the free ramp keeps rising
    priced = prior.profile_from_dict(CPU, {**truth, "gemm": held["gemm"]})
    assert priced.gemm_curve("bf16").fraction_max == pytest.approx(top)
