"""The engine: the GGUF reader, the model's hyper-parameters, the transformer's forward pass
(one sequence or a batch of them) and the KV cache, over the kernels of specdec.kernels.
It knows nothing of speculation or of the front-ends."""
