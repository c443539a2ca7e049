"""The step timeline (exchange/timeline.py) and the breakdown's arithmetic (bench/breakdown.py),
on hand-made intervals and on a real single-process exchange."""
from __future__ import annotations

import pytest
import torch

from horovod_gradcomp.bench import breakdown as bd
from horovod_gradcomp.exchange.stats import ExchangeStats
from horovod_gradcomp.exchange.timeline import Interval, TimedCommunicator, Timeline, exclusive_times, split_steps
from one_rank import OneRank


def _iv(phase, t0, t1, thread="MainThread"):
    return Interval(phase, thread, float(t0), float(t1))


def test_exclusive_times_subtract_children_and_name_collectives_by_parent():
    ivs = [_iv("step", 0, 100), _iv("backward", 1, 30), _iv("hooks", 2, 5), _iv("hooks", 10, 12),
           _iv("synchronize", 30, 90), _iv("decompress", 40, 85), _iv("flush", 41, 84),
           _iv("preamble", 42, 50), _iv("collective", 44, 49), _iv("encode", 50, 60),
           _iv("exchange", 60, 75), _iv("collective", 61, 74), _iv("decode", 75, 83),
           _iv("optimizer", 90, 97),
           _iv("encode", 3, 9, thread="hgc-exchange"), _iv("collective", 9, 20, thread="hgc-exchange")]
    t = exclusive_times(ivs)
    main = t["MainThread"]
    assert main["step"] == 100 - 29 - 60 - 7
    assert main["backward"] == 29 - 3 - 2 and main["hooks"] == 5
    assert main["synchronize"] == 60 - 45 and main["decompress"] == 45 - 43
    assert main["flush"] == 43 - 8 - 10 - 15 - 8
    assert main["preamble"] == 3 and main["preamble/collective"] == 5
    assert main["exchange"] == 2 and main["exchange/collective"] == 13
    assert main["encode"] == 10 and main["decode"] == 8 and main["optimizer"] == 7
    assert sum(main.values()) == pytest.approx(100)
    assert t["hgc-exchange"] == {"encode": 6, "none/collective": 11}


def test_split_steps_assigns_by_start():
    ivs = [_iv("step", 0, 10), _iv("encode", 2, 3, "hgc-exchange"), _iv("step", 20, 30), _iv("decode", 25, 26)]
    groups = split_steps(ivs)
    assert [len(g) for g in groups] == [2, 2] and groups[1][1].phase == "decode"


def test_stats_timed_records_only_when_attached():
    stats = ExchangeStats()
    with stats.timed("encode_s"):
        pass
    assert stats.encode_s > 0 and ExchangeStats.timeline is None
    tl = Timeline()
    stats.timeline = tl
    with stats.timed("exchange_s", phase="preamble"):
        pass
    with stats.timed("decode_s"):
        pass
    assert [iv.phase for iv in tl.intervals] == ["preamble", "decode"]
    assert "timeline" not in stats.as_dict() and ExchangeStats().timeline is None


def test_timed_communicator_records_collectives():
    tl = Timeline()
    comm = TimedCommunicator(OneRank(), tl)
    out = comm.allgather(torch.arange(4, dtype=torch.uint8))
    assert out.shape == (1, 4) and comm.size == 1
    assert [iv.phase for iv in tl.intervals] == ["collective"]


def test_a_recorded_exchange_adds_up(monkeypatch):
    """A real one-rank exchange through CodecCompression with the engine attached: encode and
    decode are recorded inside the flush and the main thread's phases add up to the step."""
    import horovod_gradcomp as hgc
    params = [torch.nn.Parameter(torch.zeros(300, 40)), torch.nn.Parameter(torch.zeros(77))]
    named = [("a", params[0]), ("b", params[1])]
    comp = hgc.Compression.codec("onebit", named, communicator=OneRank())
    tl = Timeline()
    bd.instrument(comp, tl)
    grads = {"a": torch.randn(300, 40), "b": torch.randn(77)}
    expected = {n: g.clone() for n, g in grads.items()}
    with tl.span("step"):
        out = comp.exchange(grads)
    steps = bd.step_phases(tl)
    assert len(steps) == 1
    main = steps[0]["main"]
    assert {"flush", "preamble", "encode", "decode", "exchange"} <= set(main)
    assert sum(main.values()) == pytest.approx(steps[0]["step_ms"], abs=1e-3)
    # recording changes nothing: the same result as an unrecorded compression
    ref = hgc.Compression.codec("onebit", named, communicator=OneRank()).exchange(expected)
    for n in grads:
        assert torch.equal(out[n], ref[n])


def test_summary_table_and_plot(tmp_path):
    steps = [{"step_ms": 10.0, "main": {"step": 1.0, "encode": 4.0, "exchange/collective": 5.0}, "threads": {}},
             {"step_ms": 14.0, "main": {"step": 1.0, "encode": 6.0, "exchange/collective": 7.0}, "threads": {}}]
    rows = [{"config": "onebit", "k": 2, "net": "loopback", "rate": "1gbit", "numel": 10, "ms_per_step": 12.0,
             "breakdown": [steps, steps]}, {"config": "x", "skipped": "no"}]
    summary = bd.write_breakdown(rows, str(tmp_path / "b"), note="test")
    assert len(summary) == 1 and summary[0]["ranks"][1]["mean_ms"] == {"step": 1.0, "encode": 5.0,
                                                                        "exchange/collective": 6.0}
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "b.json").exists()
    assert "onebit" in bd.format_breakdown(summary)
