"""The host probe (gnn_ptp/host_probe.py): the issue cost it reports rises when the host is busy."""

import sys
import threading

import pytest
import torch

from gnn_ptp import host_probe


def test_issue_cost_is_a_few_microseconds_on_an_idle_host():
    us = host_probe.issue_us(torch.device("cpu"))
    assert 0.1 < us < 1000


def test_a_busy_host_issues_slower(monkeypatch):
    """A pure-Python thread competing for the interpreter (what a collector's own background work, or a
    host shared with it, does to a host-bound step): the probe's mean over a few milliseconds includes the
    time the issuing thread waits for the lock. A probe that measured nothing of the host would not move."""
    import statistics

    monkeypatch.setattr(host_probe, "OPS", 20000)  # ~35 ms a probe: many 1 ms turns of the lock, not luck
    idle = min(host_probe.issue_us(torch.device("cpu")) for _ in range(3))
    running, stop = threading.Event(), threading.Event()

    def spin():
        running.set()
        x = 0
        while not stop.is_set():
            x += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # the lock changes hands every 1 ms: the test stays short
    hog = threading.Thread(target=spin, daemon=True)
    hog.start()
    try:
        assert running.wait(5)
        busy = statistics.median(host_probe.issue_us(torch.device("cpu")) for _ in range(3))
    finally:
        stop.set()
        hog.join()
        sys.setswitchinterval(old)
    assert busy > 1.5 * idle, (idle, busy)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_issue_cost_on_a_gpu_is_a_few_microseconds():
    us = host_probe.issue_us(torch.device("cuda"))
    assert 0.5 < us < 1000
