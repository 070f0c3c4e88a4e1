"""The compiled union-find against scipy's connected components (what it replaced)."""
import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components as scipy_components

from prism.common.components import connected_components


@pytest.mark.parametrize("seed", range(8))
def test_labels_are_scipys(seed):
    """Same labels, numbered the same way (by each component's lowest node), on graphs from empty to one component,
    with self-loops, repeated edges and nodes in no edge."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    m = int(rng.choice([0, 1, n // 3, n, 3 * n]))
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    if seed % 2:  # long chains: deep trees before path halving
        a, b = np.arange(n - 1)[::-1], np.arange(1, n)[::-1]
    want = scipy_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False)[1]
    got = connected_components(a, b, n)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_edges_outside_the_nodes_are_an_error():
    with pytest.raises(ValueError, match="outside 0..3"):
        connected_components(np.array([0, 4]), np.array([1, 2]), 4)
    with pytest.raises(ValueError, match="differ in length"):
        connected_components(np.array([0, 1]), np.array([1]), 4)
