"""Position choices. Each is a `gptlab.model.base.Position`: it may add to the input, rotate q/k, or bias the scores."""
