"""The two-level categorical sampler draws from the softmax, and never an
entry of probability zero."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.decoding import sampling


@pytest.mark.parametrize("block", [4, 128])  # several blocks; one padded block
def test_frequencies_follow_the_softmax(block):
  probs = np.array([0.5, 0.2, 0.0, 0.1, 0.15, 0.0, 0.05] + [0.0] * 9)
  logits = jnp.log(jnp.asarray(probs, jnp.float32))  # zeros become -inf
  n = 100_000
  draws = np.asarray(jax.jit(sampling.sample, static_argnums=2)(
      jax.random.key(0), jnp.broadcast_to(logits, (n, probs.size)), block))
  assert draws.shape == (n,) and draws.dtype == np.int32
  freq = np.bincount(draws, minlength=probs.size) / n
  assert np.all(freq[probs == 0] == 0)
  # Five standard errors of a binomial share.
  np.testing.assert_allclose(freq, probs, atol=5 * np.sqrt(0.25 / n))


def test_rows_are_independent_and_shapes_follow_the_logits():
  # Row r puts all mass on entry r: each row's draw is its own.
  logits = jnp.where(jnp.eye(300, dtype=bool), 0.0, -jnp.inf).reshape(3, 100, 300)
  draws = sampling.sample(jax.random.key(1), logits.astype(jnp.bfloat16))
  np.testing.assert_array_equal(draws, np.arange(300).reshape(3, 100))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_argmax_is_jnps_first_index_of_the_max(dtype):
  # Few distinct values, so most rows have ties: the first index must win.
  logits = jax.random.randint(jax.random.key(0), (3, 40, 97), -3, 4).astype(dtype)
  logits = logits.at[0, 0].set(-jnp.inf).at[0, 1, 5].set(jnp.inf)
  got = sampling.argmax(logits)
  assert got.dtype == jnp.int32 and got.shape == (3, 40)
  np.testing.assert_array_equal(got, jnp.argmax(logits, -1))
  assert int(sampling.argmax(jnp.array([1.0, jnp.nan, 2.0]))) == 2  # NaN: the last
