"""Control messages over ZeroMQ; tensors inline or through shared memory (one host) or TCP frames."""
