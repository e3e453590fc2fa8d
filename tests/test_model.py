"""The GNN (gnn_ptp/model.py): the per-group log-sum-exp, the node_sum readout that makes phase times
the sum of per-kernel times, every layer / norm / readout on a SYNTHETIC batch (made-up graphs, see
synthetic_data.py), and ModelConfig's checks."""

from __future__ import annotations

import math

import pytest
import torch

from gnn_ptp import ops
from gnn_ptp.errors import UserError
from gnn_ptp.model import LAYERS, NORMS, READOUTS, ModelConfig, StepTimeGNN, log_total, scatter_logsumexp

from synthetic_data import synthetic_graph


def _batch(keys=("a1", "b2")):
    from torch_geometric.data import Batch, Data

    datas = []
    for key in keys:
        g = synthetic_graph(key)
        d = Data(**g)
        d.num_nodes = g["x"].shape[0]
        datas.append(d)
    return Batch.from_data_list(datas), datas


def _naive(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    out = []
    for group in range(size):
        members = values[index == group].double()
        out.append(math.log(sum(math.exp(v) for v in members.tolist())) if len(members) else -math.inf)
    return torch.tensor(out, dtype=torch.float64)


# --- scatter_logsumexp ------------------------------------------------------------------------------------


def test_scatter_logsumexp_matches_a_per_group_loop_and_empty_groups_are_minus_inf():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(40, generator=g, dtype=torch.float64) * 3
    index = torch.randint(0, 7, (40,), generator=g)
    index[index == 4] = 5  # group 4 empty
    size = 9  # groups 7 and 8 empty too
    got = scatter_logsumexp(values, index, size)
    want = _naive(values, index, size)
    assert got.shape == (size,)
    empty = [4, 7, 8]
    assert all(got[i] == -math.inf for i in empty)
    keep = [i for i in range(size) if i not in empty]
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-12, atol=1e-12)


def test_scatter_logsumexp_single_member_group_is_the_value_itself():
    values = torch.tensor([1.5, -2.0, 0.25])
    got = scatter_logsumexp(values, torch.tensor([2, 0, 1]), 3)
    torch.testing.assert_close(got, torch.tensor([-2.0, 0.25, 1.5]))


def test_scatter_logsumexp_is_stable_for_large_and_very_negative_values():
    values = torch.tensor([1000.0, 1000.0, -1000.0, -1001.0, 88.0], dtype=torch.float32)
    index = torch.tensor([0, 0, 1, 1, 2])
    got = scatter_logsumexp(values, index, 3)
    assert torch.isfinite(got).all()  # exp(1000) overflows float32: a naive sum would give inf
    want = torch.tensor([1000 + math.log(2), -1000 + math.log1p(math.exp(-1)), 88.0])
    torch.testing.assert_close(got, want)


def test_scatter_logsumexp_gradient_is_the_softmax_within_each_group_even_with_empty_groups():
    values = torch.tensor([0.0, math.log(3.0), 2.0, 5.0], dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 0, 2, 2])
    out = scatter_logsumexp(values, index, 4)  # groups 1 and 3 are empty
    out[torch.isfinite(out)].sum().backward()
    s = 1 / (1 + math.exp(3.0))
    torch.testing.assert_close(values.grad, torch.tensor([0.25, 0.75, s, 1 - s], dtype=torch.float64))


# --- readouts -----------------------------------------------------------------------------------------


def test_node_sum_phase_times_are_the_logsumexp_of_node_times_per_graph_and_phase():
    torch.manual_seed(0)
    batch, datas = _batch(("a1", "b2"))
    model = StepTimeGNN(ModelConfig(hidden=16, depth=2, readout="node_sum")).eval()
    model.set_offsets(1.0, 2.0, 20.0)
    with torch.no_grad():
        out = model(batch)
    assert out["log_phase_ms"].shape == (2, 3)
    assert out["log_node_ms"].shape == (batch.num_nodes,)
    start = 0
    for g, d in enumerate(datas):
        nodes = out["log_node_ms"][start:start + d.num_nodes].double()
        for p in range(3):
            want = torch.logsumexp(nodes[d.phase == p], dim=0)
            torch.testing.assert_close(out["log_phase_ms"][g, p].double(), want, rtol=1e-5, atol=1e-5)
        start += d.num_nodes
    # in ms: the phase time is the sum of its kernels' times, and the step the sum of its phases
    total = out["log_node_ms"][: datas[0].num_nodes].double().exp().sum()
    torch.testing.assert_close(log_total(out["log_phase_ms"])[0].double().exp(), total, rtol=1e-5, atol=0)


def test_node_sum_graphs_do_not_leak_into_each_other():
    """A graph's predicted times do not depend on which other graphs share its batch (eval mode)."""
    torch.manual_seed(0)
    model = StepTimeGNN(ModelConfig(hidden=16, depth=2)).eval()
    with torch.no_grad():
        alone = model(_batch(("a1",))[0])["log_phase_ms"][0]
        together = model(_batch(("c3", "a1"))[0])["log_phase_ms"][1]
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-5)


def test_log_total_ignores_empty_phases():
    lp = torch.tensor([[math.log(2.0), math.log(3.0), -math.inf]])
    torch.testing.assert_close(log_total(lp), torch.tensor([math.log(5.0)]))


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("norm", NORMS)
def test_every_layer_and_norm_runs_forward_and_backward(layer, norm):
    torch.manual_seed(0)
    batch, _ = _batch(("a1", "b2", "c3"))
    model = StepTimeGNN(ModelConfig(layer=layer, norm=norm, hidden=16, depth=2, heads=2, dropout=0.1))
    model.train()
    out = model(batch)
    assert out["log_phase_ms"].shape == (3, 3) and out["log_memory"].shape == (3,)
    assert torch.isfinite(out["log_phase_ms"]).all() and torch.isfinite(out["log_memory"]).all()
    loss = out["log_phase_ms"].square().mean() + out["log_memory"].square().mean()
    loss.backward()
    grads = [p.grad for p in model.convs.parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)  # the message-passing layers are trained


@pytest.mark.parametrize("layer", LAYERS)
def test_pool_readout_runs_forward_and_backward(layer):
    torch.manual_seed(0)
    batch, _ = _batch(("a1", "b2"))
    model = StepTimeGNN(ModelConfig(layer=layer, readout="pool", hidden=16, depth=1, heads=4))
    model.set_offsets(3.0, 5.0, 20.0)
    out = model(batch)
    assert "log_node_ms" not in out
    assert out["log_phase_ms"].shape == (2, 3) and torch.isfinite(out["log_phase_ms"]).all()
    out["log_phase_ms"].sum().backward()
    assert model.pool_time[0].weight.grad is not None and model.pool_time[0].weight.grad.abs().sum() > 0
    assert model.node_time[0].weight.grad is None  # the node head is not used by pool


def test_set_offsets_starts_node_sum_predictions_near_the_mean_time():
    """With zeroed heads, per-node log-times are time_offset and the phase sums land on log_time."""
    batch, datas = _batch(("a1",))
    model = StepTimeGNN(ModelConfig(hidden=16, depth=1)).eval()
    for head in (model.node_time[-1], model.memory[-1]):
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
    n_fwd = int((datas[0].phase == 0).sum())
    model.set_offsets(2.0, math.log(n_fwd), 21.0)
    with torch.no_grad():
        out = model(batch)
    torch.testing.assert_close(out["log_phase_ms"][0, 0], torch.tensor(2.0))
    torch.testing.assert_close(out["log_memory"][0], torch.tensor(21.0))


# --- ModelConfig ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    ({"layer": "gcn"}, r"layer 'gcn' is not one of gine, gatv2, transformer"),
    ({"norm": "instance"}, r"norm 'instance' is not one of"),
    ({"readout": "mean"}, r"readout 'mean' is not one of node_sum, pool"),
    ({"layer": "gatv2", "hidden": 30, "heads": 4}, r"hidden 30 must be divisible by heads 4"),
    ({"layer": "transformer", "hidden": 20, "heads": 3}, r"hidden 20 must be divisible by heads 3"),
    ({"hidden": 4}, r"hidden 4"),
    ({"depth": -1}, r"depth -1"),
    ({"dropout": 1.0}, r"dropout 1.0"),
])
def test_model_config_rejects_bad_values(kwargs, match):
    with pytest.raises(UserError, match=match):
        ModelConfig(**kwargs)


def test_model_config_heads_only_matter_for_attention_layers():
    assert ModelConfig(layer="gine", hidden=30, heads=4).hidden == 30
    assert ModelConfig(layer="gatv2", hidden=32, heads=4).to_dict()["heads"] == 4
    assert set(READOUTS) == {"node_sum", "pool", "queue"}


# --- the queue readout ----------------------------------------------------------------------------------


def _priced_batch(keys, hardware="h100"):
    """Synthetic graphs priced by the shipped prior of ``hardware`` (``prior.price``), batched."""
    from torch_geometric.data import Batch

    from gnn_ptp import descriptor

    _, datas = _batch(keys)
    descriptor.attach(datas, [descriptor.GPU_DESCRIPTORS[hardware]] * len(datas))
    return Batch.from_data_list(datas), datas


def _queue_model(**kw):
    from gnn_ptp import descriptor

    model = StepTimeGNN(ModelConfig(hidden=16, depth=2, readout="queue", target="log_ratio_prior",
                                    hardware_descriptor=True, **kw))
    model.descriptor = descriptor.GPU_DESCRIPTORS["h100"]
    return model


def test_queue_readout_starts_at_the_priors_step_model_and_corrects_kernels_not_shares():
    """With a zero correction the queue readout gives the prior's own phase times (launch queue, host
    costs, lag); its kernel times are the kernels' device times and its node times their shares of the
    phases; a correction of the kernels moves GPU-bound phases by that factor."""
    from gnn_ptp import prior

    torch.manual_seed(0)
    batch, datas = _priced_batch(("a1", "b2", "c3"))
    model = _queue_model().eval()
    with torch.no_grad():
        model.node_time[-1].weight.zero_()
        model.node_time[-1].bias.zero_()
        out = model(batch)
    profile = prior.get_profile("h100")
    for g, d in enumerate(datas):
        want = prior.phase_ms(d, profile)[:3]
        assert out["log_phase_ms"][g].double().exp().tolist() == pytest.approx(want.tolist(), rel=1e-5)
    device_ms = torch.cat([prior.node_seconds(d.x, d.x_cat, profile) * 1e3 for d in datas])
    assert out["log_kernel_ms"].double().exp().tolist() == pytest.approx(device_ms.tolist(), rel=1e-5)
    # per-node times are shares that add up to each graph's phase (what explain and the DDP overlap read)
    node_ms, start = out["log_node_ms"].double().exp(), 0
    for g, d in enumerate(datas):
        mine = node_ms[start:start + d.num_nodes]
        sums = torch.zeros(3, dtype=torch.float64).index_add(0, d.phase, mine)
        assert sums.tolist() == pytest.approx(out["log_phase_ms"][g].double().exp().tolist(), rel=1e-5)
        start += d.num_nodes
    # the same graphs' kernels 100x longer (GPU-bound): doubling them doubles the phases
    with torch.no_grad():
        model.node_time[-1].bias.fill_(math.log(100.0))
        slow = model(batch)["log_phase_ms"]
        model.node_time[-1].bias.fill_(math.log(200.0))
        slower = model(batch)["log_phase_ms"]
    assert (slower - slow).exp().flatten().tolist() == pytest.approx([2.0] * 9, rel=1e-3)


def test_queue_readout_trains_the_kernel_head_and_the_host_factor_and_keeps_graphs_apart():
    torch.manual_seed(0)
    batch, _ = _priced_batch(("a1", "b2"))
    model = _queue_model()
    out = model(batch)
    assert out["log_phase_ms"].shape == (2, 3) and torch.isfinite(out["log_phase_ms"]).all()
    out["log_phase_ms"].sum().backward()
    assert model.node_time[0].weight.grad.abs().sum() > 0
    assert model.host_scale[-1].weight.grad.abs().sum() > 0  # synthetic kernels are tiny: host-bound
    model.eval()
    with torch.no_grad():
        alone = model(_priced_batch(("a1",))[0])["log_phase_ms"][0]
        together = model(_priced_batch(("c3", "a1"))[0])["log_phase_ms"][1]
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-5)
    # graphs that carry no prior are priced from the model's own descriptor, as predict does
    plain, _ = _batch(("a1",))
    with torch.no_grad():
        torch.testing.assert_close(model(plain)["log_phase_ms"][0], alone, rtol=1e-5, atol=1e-5)


def test_queue_readout_needs_the_residual_target():
    with pytest.raises(UserError, match="log_ratio_prior"):
        ModelConfig(readout="queue")


def _trust_pair(readout: str, **trust):
    """A priced batch, a residual model and the same weights with ``trust_region`` (and ``trust``), the
    per-node times the correction moves (``base``) and the output that holds them (``key``)."""
    from gnn_ptp import descriptor

    torch.manual_seed(0)
    batch, _ = _priced_batch(("a1", "b2"))
    cfg = dict(hidden=16, depth=1, readout=readout, target="log_ratio_prior", hardware_descriptor=True)
    plain = StepTimeGNN(ModelConfig(**cfg)).eval()
    trusted = StepTimeGNN(ModelConfig(**cfg, trust_region=True, **trust)).eval()
    trusted.load_state_dict({**plain.state_dict(), "trust_log_ms": trusted.trust_log_ms.clone()})
    for m in (plain, trusted):
        m.descriptor = descriptor.GPU_DESCRIPTORS["h100"]
    base = batch.prior_log_ms if readout == "node_sum" else batch.prior_device_log_ms
    key = "log_node_ms" if readout == "node_sum" else "log_kernel_ms"  # the corrected times
    return batch, plain, trusted, base, key


@pytest.mark.parametrize("readout", ["node_sum", "queue"])
def test_trust_region_fades_corrections_beyond_the_longest_training_kernel(readout):
    """A kernel far longer than any the model trained on gets the prior's time (its correction faded to
    nothing); one far shorter keeps the full correction; the fade is half at the boundary."""
    batch, plain, trusted, base, key = _trust_pair(readout)
    device = batch.prior_device_log_ms
    with torch.no_grad():
        full = plain(batch)[key] - base

        def ratio(trust: float) -> torch.Tensor:
            trusted.trust_log_ms.fill_(trust)
            return (trusted(batch)[key] - base) / full

        assert (ratio(float(device.max()) + 20 * math.log(2)) - 1).abs().max() < 1e-4  # all inside: unchanged
        assert ratio(float(device.min()) - 20 * math.log(2)).abs().max() < 1e-4  # all beyond: the prior's
        at = ratio(float(device[0]))
    assert abs(float(at[0]) - 0.5) < 1e-3  # half at the boundary
    assert ((at > -1e-6) & (at < 1 + 1e-6)).all()
    longer = device > device[0] + 1e-6
    assert (at[longer] < 0.5).all() and (at[device < device[0] - 1e-6] > 0.5).all()


@pytest.mark.parametrize("readout", ["node_sum", "queue"])
def test_trust_by_category_fades_each_node_against_its_own_category(readout):
    """With trust_by_category a node's boundary is its op category's: a category whose boundary lies far
    beyond its kernels keeps the full correction, one far below gets the prior's time, whatever the other
    categories' boundaries are."""
    batch, plain, trusted, base, key = _trust_pair(readout, trust_by_category=True)
    assert trusted.trust_log_ms.shape == (len(ops.CATEGORIES),)
    device = batch.prior_device_log_ms
    category = batch.x_cat[:, 1]
    kept = int(category[0])  # one category trusted everywhere, every other one nowhere
    assert (category != kept).any()
    boundary = torch.full((len(ops.CATEGORIES),), float(device.min()) - 20 * math.log(2))
    boundary[kept] = float(device.max()) + 20 * math.log(2)
    trusted.trust_log_ms.copy_(boundary)
    with torch.no_grad():
        full = plain(batch)[key] - base
        ratio = (trusted(batch)[key] - base) / full
    mine = category == kept
    assert (ratio[mine] - 1).abs().max() < 1e-4
    assert ratio[~mine].abs().max() < 1e-4
    with torch.no_grad():  # a category no training step held (-inf) has no correction
        trusted.trust_log_ms.fill_(-math.inf)
        assert (trusted(batch)[key] - base).abs().max() < 1e-5


def test_trust_region_needs_a_per_node_residual():
    with pytest.raises(UserError, match="trust_region"):
        ModelConfig(trust_region=True)
    with pytest.raises(UserError, match="trust_region"):  # a TOML string is not a switch
        ModelConfig(trust_region="false", target="log_ratio_prior")
    with pytest.raises(UserError, match="trust_region"):
        ModelConfig(trust_region=True, target="log_ratio_prior", readout="pool")
    with pytest.raises(UserError, match="trust_by_category .*trust_region = true"):
        ModelConfig(trust_by_category=True, target="log_ratio_prior")
    with pytest.raises(UserError, match="trust_by_category"):
        ModelConfig(trust_region=True, trust_by_category="yes", target="log_ratio_prior")
