"""The demo's correlation helpers against independent, scipy-free computations."""

import math

import numpy as np
import pytest

from multicritic.demo.run import pearson, spearman


def naive_ranks(x):
    """Average 1-based ranks by counting: rank = #smaller + (#equal + 1) / 2."""
    x = np.asarray(x, np.float64)
    return np.array([np.sum(x < v) + (np.sum(x == v) + 1) / 2.0 for v in x])


def naive_pearson(x, y):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def test_monotone_data_has_spearman_one():
    x = np.linspace(0.1, 5.0, 40)
    y = np.exp(3 * x)  # monotone, far from linear
    assert spearman(x, y) == pytest.approx(1.0, abs=1e-12)
    assert spearman(x, -y) == pytest.approx(-1.0, abs=1e-12)
    assert pearson(x, y) < 0.8  # Pearson sees the nonlinearity
    assert pearson(x, 2 * x + 3) == pytest.approx(1.0, abs=1e-12)
    assert pearson(x, -x) == pytest.approx(-1.0, abs=1e-12)


def test_spearman_without_ties_is_the_rank_difference_formula():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=30), rng.normal(size=30)
    d = naive_ranks(x) - naive_ranks(y)
    n = len(x)
    assert spearman(x, y) == pytest.approx(1 - 6 * np.sum(d**2) / (n * (n**2 - 1)), abs=1e-12)


def test_ties_get_their_average_rank():
    # scipy.stats.spearmanr([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == 0.8207826816681233 (scipy's docs)
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233, abs=1e-12)
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 5, size=50), rng.integers(0, 4, size=50)  # many ties
    assert spearman(x, y) == pytest.approx(naive_pearson(naive_ranks(x), naive_ranks(y)), abs=1e-12)


def test_pearson_matches_the_textbook_formula():
    rng = np.random.default_rng(2)
    x = rng.lognormal(size=48)
    y = 0.3 * x + rng.normal(size=48)
    assert pearson(x, y) == pytest.approx(naive_pearson(x, y), abs=1e-12)
    assert -1.0 <= pearson(x, y) <= 1.0


def test_undefined_correlations_are_nan():
    assert math.isnan(pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(spearman([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]))
    assert math.isnan(pearson([1.0], [2.0]))
    with pytest.raises(ValueError, match="shapes"):
        pearson([1.0, 2.0], [1.0, 2.0, 3.0])
