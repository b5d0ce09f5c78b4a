"""Native CPU kernels for XLA:CPU: C++ XLA FFI handlers built on first use for the host's own
vector instructions (``library``), and their jax ops with the plain-jnp references beside them
(``linear``)."""
