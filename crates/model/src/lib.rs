//! DeepSeek V4 model: config, weights, forward pass, KV state, synthetic models.
