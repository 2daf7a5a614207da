"""Training the pooling head: pair data, token-state cache, contrastive loss, saving heads."""
