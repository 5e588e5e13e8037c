"""tools/bench/bench_step_gaps.py cuts a profiled decode loop into replays and what ran between them."""

from tools.bench.bench_step_gaps import summarize, trace_steps


def kernel(name, ts, dur, corr, cat="kernel"):
    return {"cat": cat, "ph": "X", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def launch(ts, corr):
    return {"cat": "cuda_runtime", "ph": "X", "name": "cudaGraphLaunch", "ts": ts, "dur": 5.0,
            "args": {"correlation": corr}}


def test_trace_steps_periods_ops_and_idle():
    events = [launch(0.0, 10), launch(50.0, 20), launch(150.0, 30),
              # replay 1: two kernels of one graph launch, 100..200
              kernel("embedding_kernel", 100.0, 10.0, 10), kernel("lm_head", 150.0, 50.0, 10),
              kernel("argmax_kernel", 203.0, 4.0, 11),  # outside: its own correlation
              kernel("Memcpy DtoH", 207.0, 2.0, 12, cat="gpu_memcpy"),
              kernel("Memcpy HtoD", 208.0, 3.0, 13, cat="gpu_memcpy"),  # overlaps the DtoH by 1
              # replay 2: 215..300
              kernel("embedding_kernel", 215.0, 5.0, 20), kernel("lm_head", 250.0, 50.0, 20),
              # replay 3 (the last: no period)
              kernel("embedding_kernel", 320.0, 5.0, 30)]
    steps = trace_steps(events)
    assert [s["kernels"] for s in steps] == [2, 2, 1]
    first = steps[0]
    assert first["replay_us"] == 100.0 and first["host_lead_us"] == 100.0
    assert first["period_us"] == 115.0 and first["between_us"] == 15.0
    assert first["busy_between_us"] == 8.0 and first["idle_between_us"] == 7.0  # 203..211 busy
    assert [op[0] for op in first["ops"]] == ["argmax_kernel", "Memcpy DtoH", "Memcpy HtoD"]
    assert first["ops"][0][1:] == [3.0, 4.0]
    assert steps[1]["period_us"] == 105.0 and steps[1]["ops"] == [] and steps[1]["idle_between_us"] == 20.0
    assert "period_us" not in steps[2]
    summary = summarize(steps)  # the first full step is dropped (after the warm-up)
    assert summary["steps"] == 1 and summary["period_us"] == 105.0 and summary["ops"] == []
