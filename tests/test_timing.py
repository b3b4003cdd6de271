"""Phase clocks: nested phases count each second once, scopes, and compilations moved out."""

import time

import jax
import jax.numpy as jnp
import pytest

from agentrl_jax import compile_cache, timing


def test_nested_phases_keep_their_own_seconds_and_sum_to_the_outer_time():
    clock = timing.PhaseClock()
    t0 = time.perf_counter()
    with clock.running(), timing.phase("text"):
        time.sleep(0.02)
        with timing.phase("env"):
            time.sleep(0.03)
        with timing.phase("sample"):
            time.sleep(0.01)
    wall = time.perf_counter() - t0
    s = clock.seconds
    assert s["env"] == pytest.approx(0.03, abs=0.015)
    assert s["sample"] == pytest.approx(0.01, abs=0.015)
    assert s["text"] == pytest.approx(0.02, abs=0.015)  # without its children's 0.04
    assert clock.total == pytest.approx(wall, abs=0.005)


def test_a_scope_records_its_phases_under_its_name():
    clock = timing.PhaseClock()
    with clock.running(), timing.phase("evaluate", scope=True):
        with timing.phase("sample"):
            pass
        with timing.phase("text"), timing.phase("env"):  # a plain phase inside keeps the scope
            pass
    assert set(clock.seconds) == {"evaluate", "evaluate/sample", "evaluate/text", "evaluate/env"}


def test_phase_is_a_no_op_without_a_running_clock():
    clock = timing.PhaseClock()
    with timing.phase("sample"):
        pass
    assert clock.total == 0 and not clock.seconds


def test_compilations_move_out_of_the_phase_that_triggered_them():
    clock = timing.PhaseClock()
    x = jnp.arange(7.0)
    fn = jax.jit(lambda v: jnp.cumsum(jnp.sin(v) * 3.0) + 0.123)  # a program no test compiled
    with clock.running(), timing.phase("sample"):
        fn(x).block_until_ready()
    assert clock.compilations >= 1
    assert clock.seconds["compile"] > 0
    assert clock.seconds["sample"] >= 0
    assert clock.total == pytest.approx(clock.seconds["sample"] + clock.seconds["compile"])
    before = timing.TOTALS.compilations
    with clock.running(), timing.phase("sample"):
        fn(x).block_until_ready()  # cached in the process: no compilation
    assert timing.TOTALS.compilations == before


def test_iteration_profile_coverage_and_busy_fraction():
    profile = timing.IterationProfile(
        iteration=2,
        wall_s=10.0,
        phases={"env": 3.0, "sample": 2.0, "update": 3.0, "evaluate/sample": 1.0, "log": 0.5},
        compilations=0,
        cache_hits=0,
    )
    assert profile.coverage == pytest.approx(0.95)
    assert profile.device_busy_fraction == pytest.approx(0.6)  # sample, update, evaluate/sample
    metrics = timing.phase_metrics(timing.PhaseClock())
    assert metrics["perf/device_busy_fraction"] == 0.0


def test_compile_cache_folder_default_and_off(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    assert compile_cache.default_dir() == str(tmp_path / "jax")
    assert compile_cache.enable("off") is None
