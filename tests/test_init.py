import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmtjax.networks.init import orthogonal


@pytest.mark.parametrize("shape", [(8, 8), (16, 4), (4, 16), (3, 3, 2, 5)])
@pytest.mark.parametrize("scale", [1.0, np.sqrt(2), 0.01])
def test_orthonormal_with_the_scale_and_jax_s_own_matrix_for_the_same_key(shape, scale):
    key = jax.random.key(7)
    w = np.asarray(orthogonal(scale)(key, shape), np.float64)
    flat = w.reshape(-1, shape[-1])
    gram = flat.T @ flat if flat.shape[0] >= flat.shape[1] else flat @ flat.T
    np.testing.assert_allclose(gram, scale**2 * np.eye(len(gram)), atol=1e-5 * max(scale**2, 1))
    np.testing.assert_allclose(w, np.asarray(jax.nn.initializers.orthogonal(scale)(key, shape)), atol=2e-5)


def test_under_vmap_over_seeds_it_compiles_to_plain_arithmetic():
    keys = jax.random.split(jax.random.key(0), 4)
    init = jax.jit(jax.vmap(lambda k: orthogonal(1.0)(k, (32, 32))))
    hlo = init.lower(keys).compile().as_text()
    assert " custom-call(" not in hlo and "geqrf" not in hlo  # no LAPACK (or other) custom call
    w = np.asarray(init(keys))
    for i in range(4):
        np.testing.assert_allclose(w[i].T @ w[i], np.eye(32), atol=1e-5)
    assert not np.allclose(w[0], w[1])  # each seed its own matrix
