"""The optimizer state's zero count (gnn_ptp/optimizer_state.py): exact on a model whose zeros are known."""

import torch

from gnn_ptp import optimizer_state


def test_untouched_embedding_rows_are_counted_as_zero_moments():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)  # a batch touching rows 0-2 leaves rows 3-9 with zero gradients
    head = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW([*emb.parameters(), *head.parameters()])
    for _ in range(3):
        opt.zero_grad()
        head(emb(torch.tensor([0, 1, 2, 1]))).sum().backward()
        opt.step()
    counts = optimizer_state.zero_counts(opt)
    assert set(counts) == {"exp_avg", "exp_avg_sq"}  # "step" is a scalar: left out
    assert counts["exp_avg_sq"] == {"elements": 10 * 4 + 4 * 3 + 3, "zeros": 7 * 4}
    record = {"optimizer_state": counts}
    assert optimizer_state.zero_fraction(record) == 28 / 55
    assert optimizer_state.zero_fraction({}) is None and optimizer_state.zero_counts(None) == {}


def test_sgd_momentum_and_no_state():
    w = torch.nn.Parameter(torch.ones(5))
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    assert optimizer_state.zero_counts(opt) == {}  # no step yet, no state
    (w * torch.tensor([1.0, 0, 0, 2, 0])).sum().backward()
    opt.step()
    assert optimizer_state.zero_counts(opt) == {"momentum_buffer": {"elements": 5, "zeros": 3}}


def test_chunked_count_matches_a_direct_one(monkeypatch):
    monkeypatch.setattr(optimizer_state, "CHUNK", 7)  # many chunks, a ragged last one
    t = torch.tensor([[0.0, 1.0, -0.0, 2.0, 0.0], [3.0, 0.0, float("nan"), 0.0, 1e-40]])
    assert optimizer_state._zeros(t) == int((t == 0).sum()) == 5  # -0.0 is a zero; NaN and 1e-40 are not


def _zero_sqrt():
    from conftest import benchmark_module

    return benchmark_module("zero_sqrt")


def test_in_situ_slope_from_synthetic_records(tmp_path, capsys):
    import json

    import pytest

    rows = []  # synthetic records, named so: one model, optimizer 10 ms + 4 ns per zero moment
    for i, zeros in enumerate([0, 1_000_000, 2_000_000, 3_000_000]):
        rows.append({"status": "ok", "family": "synthetic", "key": f"k{i}",
                     "config": {"spec": "random:mlp:0", "set": {}, "precision": "fp32"},
                     "optimizer_state": {"exp_avg_sq": {"elements": 4_000_000, "zeros": zeros}},
                     "timing": {"optimizer_ms": {"median": 10 + 4e-6 * zeros}}})
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _zero_sqrt().slope_table(tmp_path)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("fp32"))
    assert line.split()[1:] == ["3", "4.00", "1.00"]
    empty = tmp_path / "old"
    empty.mkdir()
    (empty / "a.jsonl").write_text(json.dumps({**rows[0], "optimizer_state": None}) + "\n")
    with pytest.raises(SystemExit, match="no record counts its optimizer state's zeros"):
        _zero_sqrt().slope_table(empty)


def test_new_batches_each_step_touch_more_embedding_rows():
    """The collector's one batch leaves every token row it never indexes with a zero second moment; a new
    batch each step touches more of them. Real model, real AdamW steps, one thread."""
    from gnn_ptp.spec import ModelSpec, Shape

    zero_sqrt = _zero_sqrt()
    spec = ModelSpec.from_dict({"spec": "random:transformer:16", "set": {"vocab_size": 512}})
    shape = Shape(8, 32, None)  # 256 tokens a batch: about 40 % of the 512 rows, four batches about 86 %
    one = zero_sqrt._zero_share_after(spec, shape, 4, fresh=False)
    new = zero_sqrt._zero_share_after(spec, shape, 4, fresh=True)
    assert 0 < new < one - 0.03, (one, new)
