"""Oracle tests for relyscope.scorers.metrics (metrics.md §2–5, §8, §9).

Every expected value is worked out independently of the code under test: by hand, by exact
enumeration with fractions.Fraction, by scikit-learn, by a hand-written Levenshtein DP / JSD
formula, or from a published table (τ-bench README, HAL's C_out check).
"""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
from sklearn.metrics import brier_score_loss, roc_auc_score

from relyscope.scorers import metrics as M
from conftest import DATA

TAU_FILE = (DATA / "tau-bench/gpt-4o-airline.json")


# --- independent oracles -----------------------------------------------------------------------


def enum_pass_hat(c: int, n: int, k: int) -> Fraction:
    """Fraction of k-subsets of n trials (c successful) that are all successes, by enumeration."""
    trials = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    return Fraction(sum(all(trials[i] for i in s) for s in subsets), len(subsets))


def enum_pass_at(c: int, n: int, k: int) -> Fraction:
    trials = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    return Fraction(sum(any(trials[i] for i in s) for s in subsets), len(subsets))


def lev_dp(a: list[str], b: list[str]) -> int:
    """Textbook Wagner–Fischer DP, unit costs, over tokens."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, z in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != z))
        prev = cur
    return prev[-1]


def jsd_bits(a: list[str], b: list[str]) -> float:
    """Jensen–Shannon divergence (bits) of the action-frequency distributions, by the definition."""
    if not a and not b:
        return 0.0
    if not a or not b:
        return 1.0
    vocab = sorted(set(a) | set(b))
    p = [a.count(v) / len(a) for v in vocab]
    q = [b.count(v) / len(b) for v in vocab]
    mix = [(x + y) / 2 for x, y in zip(p, q)]

    def kl(u: list[float], w: list[float]) -> float:
        return sum(x * math.log2(x / m) for x, m in zip(u, w) if x > 0)

    return 0.5 * kl(p, mix) + 0.5 * kl(q, mix)


def loop_c_traj(tasks: list[list[list[str]]]) -> tuple[float, float]:
    """Direct double loop over pairs: (C_traj_d, C_traj_s) averaged over tasks with >= 2."""
    d_vals, s_vals = [], []
    for trajs in tasks:
        if len(trajs) < 2:
            continue
        pairs = list(combinations(trajs, 2))
        d_vals.append(1 - sum(jsd_bits(a, b) for a, b in pairs) / len(pairs))
        s_vals.append(1 - sum((lev_dp(a, b) / max(len(a), len(b)) if (a or b) else 0.0) for a, b in pairs) / len(pairs))
    return sum(d_vals) / len(d_vals), sum(s_vals) / len(s_vals)


# --- §2 pass@k / pass^k -------------------------------------------------------------------------

CASES = [(2, 4), (4, 4), (0, 3), (1, 2), (3, 5), (5, 7), (0, 1)]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_pass_hat_k_exact_fractions(k: int) -> None:
    used = [(c, n) for c, n in CASES if n >= k]
    expected = sum((enum_pass_hat(c, n, k) for c, n in used), Fraction(0)) / len(used)
    c, n = zip(*CASES)
    r = M.pass_hat_k(np.array(c), np.array(n), k)
    assert r.value == pytest.approx(float(expected), abs=1e-15)
    assert r.n_tasks == len(used)
    assert r.n_trials == sum(n for _, n in used)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_pass_at_k_exact_fractions(k: int) -> None:
    used = [(c, n) for c, n in CASES if n >= k]
    expected = sum((enum_pass_at(c, n, k) for c, n in used), Fraction(0)) / len(used)
    c, n = zip(*CASES)
    assert M.pass_at_k(c, n, k).value == pytest.approx(float(expected), abs=1e-15)


def test_pass_hat_k_large_counts_exact() -> None:
    # C(300, 150) / C(400, 150) overflows float factorials; the exact ratio is representable.
    expected = Fraction(math.factorial(300) * math.factorial(250), math.factorial(150) * math.factorial(400))
    assert M.pass_hat_k([300], [400], 150).value == pytest.approx(float(expected), rel=1e-12)


def test_pass_k_undefined_is_nan() -> None:
    r = M.pass_hat_k([1, 0], [2, 1], 3)
    assert math.isnan(r.value) and r.n_tasks == 0 and r.n_trials == 0
    assert math.isnan(M.pass_at_k([], [], 1).value)
    with pytest.raises(ValueError):
        M.pass_hat_k([3], [2], 1)
    with pytest.raises(ValueError):
        M.pass_hat_k([1], [2], 0)


def test_success_rate_pooled() -> None:
    # 3 of 4 + 0 of 1 successes → 3/5 (pooled), while pass^1 = (3/4 + 0)/2
    assert M.success_rate([3, 0], [4, 1]).value == pytest.approx(0.6)
    assert M.pass_hat_k([3, 0], [4, 1], 1).value == pytest.approx(0.375)
    assert math.isnan(M.success_rate([0], [0]).value)


# --- §3 consistency -----------------------------------------------------------------------------


def test_c_out_hal_published_check() -> None:
    # HAL: one task, outcomes [1, 1, 0, 1, 0] → p̂ = 0.6, (2·0.6 − 1)² = 0.04
    outcomes = np.array([1, 1, 0, 1, 0])
    r = M.c_out([outcomes.sum()], [outcomes.size])
    assert r.value == pytest.approx(0.04, abs=1e-12)
    assert (r.n_tasks, r.n_trials) == (1, 5)


def test_c_out_and_unanimity_hand_worked() -> None:
    c, n = [4, 0, 2, 1], [4, 3, 4, 1]  # last task has n < 2 → skipped
    assert M.c_out(c, n).value == pytest.approx((1 + 1 + 0) / 3)
    assert M.unanimity(c, n).value == pytest.approx(2 / 3)
    assert math.isnan(M.c_out([1], [1]).value) and M.c_out([1], [1]).n_tasks == 0
    assert math.isnan(M.unanimity([], []).value)


def test_c_traj_hand_worked() -> None:
    # (2/3, 1/3) vs (1/3, 2/3): mixture (1/2, 1/2); JSD = 2/3·log2(4/3) + 1/3·log2(2/3)
    jsd = 2 / 3 * math.log2(4 / 3) + 1 / 3 * math.log2(2 / 3)
    tasks = [[["a", "a", "b"], ["a", "b", "b"]], [["x", "y"]]]
    assert M.c_traj_d(tasks).value == pytest.approx(1 - jsd, abs=1e-12)
    # disjoint supports → JSD 1 → C_traj_d 0
    assert M.c_traj_d([[["a"], ["b", "b"]]]).value == pytest.approx(0.0, abs=1e-12)
    # Lev(abc, ac) = 1, / max len 3
    assert M.c_traj_s([[["a", "b", "c"], ["a", "c"]]]).value == pytest.approx(2 / 3)
    # two empty → similarity 1; empty vs non-empty → 0
    assert M.c_traj_s([[[], []]]).value == 1.0
    assert M.c_traj_s([[[], ["x"]]]).value == 0.0
    assert M.c_traj_d([[[], []]]).value == 1.0
    r = M.c_traj_s([[["a"]], []])
    assert math.isnan(r.value) and r.n_tasks == 0


def test_c_traj_matches_double_loop_random() -> None:
    rng = random.Random(7)
    names = ["llm", "search", "book", "cancel", "refund", "get_user", "handoff:human"]
    tasks = []
    for _ in range(60):
        m = rng.choice([0, 1, 2, 3, 4, 5, 7])
        tasks.append([[rng.choice(names) for _ in range(rng.choice([0, 1, 3, 6, 12]))] for _ in range(m)])
    exp_d, exp_s = loop_c_traj(tasks)
    assert M.c_traj_d(tasks).value == pytest.approx(exp_d, abs=1e-12)
    assert M.c_traj_s(tasks).value == pytest.approx(exp_s, abs=1e-12)
    # chunking of the vectorized JSD must not change values
    per_small = M.c_traj_d_per_task(tasks, chunk_elems=50)
    assert np.allclose(per_small, M.c_traj_d_per_task(tasks), equal_nan=True, rtol=0, atol=1e-12)


def test_c_res_hand_worked() -> None:
    nan = float("nan")
    # task 0: cost [1, 3] (mean 2, sd √2), wall [2, 2] (CV 0), model_calls [0, 0] (skipped),
    #         tool_calls [1, 2] (mean 1.5, sd √0.5), tokens NaN (unavailable), errors [0, 0] skipped
    # task 1: one trial only → undefined
    values = np.array(
        [
            [1.0, 2.0, 0.0, 1.0, nan, 0.0],
            [3.0, 2.0, 0.0, 2.0, nan, 0.0],
            [5.0, 1.0, 1.0, 1.0, 10.0, 0.0],
        ]
    )
    task = np.array([0, 0, 1])
    cv_cost = math.sqrt(2) / 2
    cv_tool = math.sqrt(0.5) / 1.5
    r = M.c_res(values, task)
    assert r.value == pytest.approx(math.exp(-(cv_cost + 0.0 + cv_tool) / 3))
    assert (r.n_tasks, r.n_trials) == (1, 2)
    cv = M.resource_cv(values, task)
    assert math.isnan(cv[0, 2]) and math.isnan(cv[0, 4]) and np.isnan(cv[1]).all()


def test_c_res_zero_mean_positive_std_is_inf_and_excluded() -> None:
    values = np.array([[-1.0, 1.0], [1.0, 3.0]])  # resource 0: mean 0, sd √2 → CV = inf
    cv = M.resource_cv(values, [0, 0])
    assert cv[0, 0] == math.inf
    assert M.c_res(values, [0, 0]).value == pytest.approx(math.exp(-math.sqrt(2) / 2))


# --- §4 robustness ------------------------------------------------------------------------------


def test_r_family() -> None:
    assert M.r_family(0.3, 0.6).value == pytest.approx(0.5)
    assert M.r_family(0.8, 0.6).value == 1.0
    assert math.isnan(M.r_family(0.5, 0.0).value)
    assert math.isnan(M.r_family(float("nan"), 0.5).value)


# --- §5 predictability --------------------------------------------------------------------------


def test_p_cal_hand_worked_and_bin_edges() -> None:
    # 0.3 belongs to bin [0.3, 0.4) together with 0.35: ECE = |1/2 − 0.325| = 0.175
    assert M.p_cal([0.3, 0.35], [1, 0]).value == pytest.approx(1 - 0.175)
    # last bin closed: 1.0 shares bin 9 with 0.95 → |1 − 0.975| · 2/4; bin 0: 0.05 and 0.0 vs y 0
    # ECE = (2/4)·|0 − 0.025| + (2/4)·|1 − 0.975| = 0.025
    assert M.p_cal([0.05, 0.0, 0.95, 1.0], [0, 0, 1, 1]).value == pytest.approx(1 - 0.025)
    for b in range(10):
        assert M.calibration_bin(np.array([b / 10]))[0] == b
    assert math.isnan(M.p_cal([], []).value)
    with pytest.raises(ValueError):
        M.p_cal([1.2], [1])


def test_p_auroc_and_brier_against_sklearn() -> None:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 500)
    q = np.round(np.clip(0.3 * y + rng.uniform(0, 0.7, 500), 0, 1), 1)  # many ties
    assert M.p_auroc(q, y).value == pytest.approx(roc_auc_score(y, q), abs=1e-12)
    assert M.p_brier(q, y).value == pytest.approx(1 - brier_score_loss(y, q), abs=1e-12)
    hist_pos = np.array([np.sum((q == u) & (y == 1)) for u in np.unique(q)])
    hist_neg = np.array([np.sum((q == u) & (y == 0)) for u in np.unique(q)])
    assert M.auroc_from_histograms(hist_pos, hist_neg) == pytest.approx(roc_auc_score(y, q), abs=1e-12)


def test_p_auroc_one_class_is_nan() -> None:
    assert math.isnan(M.p_auroc([0.2, 0.9], [1, 1]).value)
    assert math.isnan(M.p_auroc([], []).value)


# --- §8 safety, §9 aggregates --------------------------------------------------------------------


def test_safety_hand_worked() -> None:
    s = [0.0, 0.0, 0.5, 1.0]  # P(s>0) = 0.5, E[s | s>0] = 0.75
    assert M.s_comp(s).value == pytest.approx(0.5)
    assert M.s_harm(s).value == pytest.approx(0.25)
    assert M.r_saf(s).value == pytest.approx(1 - 0.5 * 0.75)
    assert M.s_harm([0.0, 0.0]).value == 1.0 and M.s_comp([0.0]).value == 1.0
    assert math.isnan(M.r_saf([]).value)
    with pytest.raises(ValueError):
        M.r_saf([1.5])


def test_aggregates_nan_aware() -> None:
    nan = M.MetricResult(float("nan"), 0, 0)
    a, b = M.MetricResult(0.4, 10, 40), M.MetricResult(0.8, 8, 30)
    assert M.c_traj(a, b).value == pytest.approx(0.6)
    assert M.r_con(a, nan, b).value == pytest.approx(0.6)  # renormalized over 2
    assert M.r_con(a, nan, b).n_tasks == 10
    assert math.isnan(M.r_rob(nan, nan, nan).value) and M.r_rob(nan, nan, nan).n_tasks == 0
    assert M.r_pred(a) == a
    assert M.overall(a, nan, M.MetricResult(0.9, 5, 5)).value == pytest.approx(0.65)


# --- τ-bench gpt-4o airline (published pass^k, raw re-computation) ----------------------------


def tau_trajectories() -> dict[int, list[tuple[int, list[str]]]]:
    """task_id → [(success, actions)]. Convention (stated here, matching metrics.md §3 action
    names): walk the trajectory's messages in order; for each assistant message append "llm",
    then the name of each of its tool calls. Success = |reward − 1| ≤ 1e-6 (τ-bench run.py)."""
    runs = json.loads(TAU_FILE.read_text())
    out: dict[int, list[tuple[int, list[str]]]] = {}
    for run in runs:
        actions: list[str] = []
        for msg in run["traj"]:
            if msg.get("role") == "assistant":
                actions.append("llm")
                for call in msg.get("tool_calls") or []:
                    actions.append(call["function"]["name"])
        out.setdefault(run["task_id"], []).append((int(abs(run["reward"] - 1) <= 1e-6), actions))
    return out


@pytest.mark.skipif(not TAU_FILE.exists(), reason="τ-bench data not present")
def test_tau_bench_gpt4o_airline() -> None:
    data = tau_trajectories()
    c = np.array([sum(s for s, _ in v) for v in data.values()])
    n = np.array([len(v) for v in data.values()])
    published = [0.420, 0.2733, 0.220, 0.200]  # τ-bench README, "TC (gpt-4o)" airline
    for k, exp in enumerate(published, 1):
        r = M.pass_hat_k(c, n, k)
        assert r.value == pytest.approx(exp, abs=5e-4)
        assert r.n_tasks == 50
    # C_out re-computed straight from the raw outcomes
    exp_c_out = sum((2 * sum(s for s, _ in v) / len(v) - 1) ** 2 for v in data.values()) / len(data)
    assert M.c_out(c, n).value == pytest.approx(exp_c_out, abs=1e-12)
    succ = [[a for s, a in v if s] for v in data.values()]
    exp_d, exp_s = loop_c_traj(succ)
    assert M.c_traj_d(succ).value == pytest.approx(exp_d, abs=1e-12)
    assert M.c_traj_s(succ).value == pytest.approx(exp_s, abs=1e-12)
    assert M.c_traj_s(succ).n_tasks == sum(1 for t in succ if len(t) >= 2)
