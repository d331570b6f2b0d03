"""The tree-size controller (core/budget.py): costs per exact tree size, robust to outliers."""

from completiond.core.budget import OUTLIER, TreeBudget


def budget(costs: dict[int, float]) -> TreeBudget:
    b = TreeBudget()
    b.load_costs(costs)
    return b


def test_an_observed_size_is_used_exactly_not_interpolated():
    # the AVX2 kernel's shape: 3 nodes cost what 4 do (calibrated at powers of two only)
    b = budget({1: 40.0, 2: 40.0, 4: 58.0, 8: 95.0})
    assert b.cost(3) == 49.0  # interpolated until a 3-node pass is seen
    b.observe_pass(3, 58.0)
    assert b.cost(3) == 58.0 and b.cost(4) == 58.0 and b.cost(2) == 40.0
    assert b.cost(6) == 58.0 + (95.0 - 58.0) / 2  # sizes not seen still interpolate between neighbours


def test_the_controller_does_not_pay_for_a_node_that_costs_like_two():
    values = [1.0, 0.9, 0.5, 0.3]  # root, then the best-first candidates' path probabilities
    b = budget({1: 40.0, 2: 40.0, 4: 58.0})
    assert b.best_size(values) == 2  # believes 3 nodes cost 49: (1 + 0.9 + 0.5) / 49 beats 1.9 / 40
    b.observe_pass(3, 58.0)
    assert b.best_size(values) == 1  # 2.4 / 58 and 2.7 / 58 both lose to 1.9 / 40


def test_outliers_move_an_estimate_only_so_far():
    b = budget({1: 40.0, 2: 40.0, 4: 58.0, 8: 95.0})
    b.observe_pass(2, 10_000.0)  # a burst of load elsewhere
    assert b.cost(2) == 40.0 + 0.1 * (OUTLIER - 1) * 40.0
    b.observe_pass(3, 10_000.0)  # first sight of a size: within OUTLIER x its interpolation
    assert b.cost(3) == OUTLIER * (b.cost(2) + 58.0) / 2
    b.observe_pass(5, 0.001)
    assert b.cost(5) == (58.0 + (95.0 - 58.0) / 4) / OUTLIER
    for _ in range(60):  # a size that really got dearer (a longer context) is still learned
        b.observe_pass(4, 90.0)
    assert 85.0 < b.cost(4) <= 90.0
