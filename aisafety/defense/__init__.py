"""Defense module: input transforms wrapped around a predictor."""
